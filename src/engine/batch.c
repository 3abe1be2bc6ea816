/*
 * batch.c
 *	  Independent decisions (rl_consume_many, a statement trigger's subjects)
 *	  in one round trip per Redis node: every call goes out before the first
 *	  reply is read (redis/pipeline.c groups them by node, each node's in one
 *	  exchange), so a batch costs one round trip and a deadline, not one per
 *	  decision. Each decision is exactly what decision_run would have made:
 *	  fixed answers, a slice held here, a denial remembered, Redis, or its
 *	  own policy's fail mode when its node did not answer; then shadow mode.
 *	  A batch never fetches a slice: the subject's fetch would be held for
 *	  the batch's whole round trip, and every other backend taking from that
 *	  subject would wait for it.
 */
#include "prelude.h"

#include "base/clock.h"
#include "engine/batch.h"
#include "engine/denial.h"
#include "engine/observer.h"

/* Ends every fetch of a slice the batch began (an error while Redis was asked). */
static void
abandon_all(const AllowancePlan *plans, int count)
{
	for (int i = 0; i < count; i++)
		allowance_abandon(&plans[i]);
}

/* Appends a slice to give back to backs (of *room), growing it when needed. */
static SliceGiveBack *
room_for(SliceGiveBack *backs, int nbacks, int *room)
{
	if (nbacks + SLICE_MAX_GIVEBACKS > *room)
	{
		*room *= 2;
		backs = repalloc(backs, *room * sizeof(SliceGiveBack));
	}
	return backs;
}

/* Decides count checked requests into decisions, each with its plan (zeroed). */
static void
batch_decide(const DecisionRequest *requests, Decision *decisions, AllowancePlan *plans,
			 int count)
{
	RedisCall  *mains = palloc0(count * sizeof(RedisCall));
	const char **keys = palloc(count * sizeof(char *));
	int		   *asked = palloc(count * sizeof(int));
	int			ncalls = 0;
	int			room = SLICE_MAX_GIVEBACKS;
	SliceGiveBack *backs = palloc(room * sizeof(SliceGiveBack));
	int			nbacks = 0;
	int			late_room = SLICE_MAX_GIVEBACKS;
	SliceGiveBack *lates = palloc(late_room * sizeof(SliceGiveBack));
	int			nlates = 0;
	RedisCall  *calls;
	RedisFailure failure = {0};
	int64		asked_us;

	for (int i = 0; i < count; i++)
	{
		const DecisionRequest *request = &requests[i];
		DecisionRequest sent;
		int			more = 0;

		decision_init(&request->policy, &decisions[i]);
		/* A refund goes to the bucket whatever answers decisions. */
		if (request->mode != BUCKET_REFUND &&
			(decision_fixed(&request->policy, &decisions[i]) ||
			 decision_here(request, false, &plans[i], &backs[nbacks], &more, &decisions[i])))
			continue;
		nbacks += more;
		backs = room_for(backs, nbacks, &room);
		sent = *request;
		sent.key = keys[ncalls] = decision_key(request);
		allowance_request(&plans[i], &sent);
		decision_redis_call(&sent, &mains[ncalls]);
		asked[ncalls++] = i;
	}
	/* Slices given back go first: a slice taken after them may take their tokens again. */
	calls = palloc0(Max(nbacks + ncalls, 1) * sizeof(RedisCall));
	for (int b = 0; b < nbacks; b++)
		decision_give_back_call(&backs[b], &calls[b]);
	memcpy(&calls[nbacks], mains, ncalls * sizeof(RedisCall));
	/*
	 * While a node's breaker is open, its calls are not sent at all; the
	 * deadline grows with the batch (redis/pipeline.c).
	 */
	asked_us = clock_monotonic_us();
	if (nbacks + ncalls > 0)
		(void) redis_run_scripts(calls, nbacks + ncalls, 0, &failure);
	for (int n = 0; n < ncalls; n++)
	{
		RedisCall  *call = &calls[nbacks + n];
		const DecisionRequest *request = &requests[asked[n]];
		AllowancePlan *plan = &plans[asked[n]];
		Decision   *decision = &decisions[asked[n]];
		RedisFailure outcome = call->failure.kind != REDIS_FAILURE_NONE ? call->failure : failure;
		bool		answered = call->answered && allowance_reply(plan, call->results, &outcome) &&
			decision_from_reply(call->results, decision, &outcome);

		engine_observe_redis(&request->policy, answered, &outcome, call->round_trip_us);
		if (allowance_after(plan, keys[n], answered, answered && decision->allowed,
							&decision->remaining, decision->reset_after_ms, &lates[nlates]))
			lates = room_for(lates, ++nlates, &late_room);
		denial_learn(request, decision, asked_us);
		/* A script's failure is raised by the caller, once every decision is kept. */
		if (!answered && !decision_script_failed(&request->policy, &outcome, decision))
			decision_by_fail_mode(request, call->retry_after_ms, decision);
	}
	/* Slices fetched while another was (rare): given back once every slice is in. */
	decision_give_back(lates, nlates);
	for (int i = 0; i < count; i++)
	{
		if (requests[i].mode != BUCKET_REFUND)
			decision_shadow(&requests[i].policy, &decisions[i]);
		if (requests[i].mode == BUCKET_TAKE)
			engine_observe_decision(&requests[i], &decisions[i], requests[i].cost);
	}
	pfree(calls);
	pfree(asked);
	pfree(mains);
	pfree(keys);
	pfree(backs);
	pfree(lates);
}

/*
 * Decides at most BATCH_MAX_DECISIONS checked requests into decisions; a
 * fetch of a slice begun here ends here, whatever is raised meanwhile.
 */
static void
batch_run_chunk(const DecisionRequest *requests, Decision *decisions, int count)
{
	AllowancePlan *plans = palloc0(count * sizeof(AllowancePlan));

	PG_TRY();
	{
		batch_decide(requests, decisions, plans, count);
	}
	PG_CATCH();
	{
		abandon_all(plans, count);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(plans);
}

/*
 * Decides count checked requests (each a take, peek or refund) into
 * decisions: BATCH_MAX_DECISIONS at a time, each in one round trip per node.
 */
void
batch_run(const DecisionRequest *requests, Decision *decisions, int count)
{
	for (int done = 0; done < count; done += BATCH_MAX_DECISIONS)
		batch_run_chunk(&requests[done], &decisions[done], Min(count - done, BATCH_MAX_DECISIONS));
}
