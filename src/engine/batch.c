/*
 * batch.c
 *	  Independent decisions (rl_consume_many, a statement trigger's subjects)
 *	  in one round trip per Redis node: every call goes out before the first
 *	  reply is read (redis/pipeline.c groups them by node, each node's in one
 *	  exchange), so a batch costs one round trip and a deadline, not one per
 *	  decision. Each decision is exactly what decision_run would have made:
 *	  fixed answers, a denial remembered, Redis, or its own policy's fail
 *	  mode when its node did not answer; then shadow mode.
 */
#include "prelude.h"

#include "engine/batch.h"
#include "engine/observer.h"

/* Decides at most BATCH_MAX_DECISIONS checked requests into decisions. */
static void
batch_run_chunk(const DecisionRequest *requests, Decision *decisions, int count)
{
	RedisCall  *calls = palloc0(count * sizeof(RedisCall));
	int		   *asked = palloc(count * sizeof(int));
	int			ncalls = 0;
	RedisFailure failure = {0};

	for (int i = 0; i < count; i++)
	{
		const DecisionRequest *request = &requests[i];

		decision_init(&request->policy, &decisions[i]);
		/* A refund goes to the bucket whatever answers decisions. */
		if (request->mode != BUCKET_REFUND &&
			(decision_fixed(&request->policy, &decisions[i]) ||
			 decision_denied_before(request, &decisions[i])))
			continue;
		decision_redis_call(request, &calls[ncalls]);
		asked[ncalls++] = i;
	}
	/*
	 * While a node's breaker is open, its calls are not sent at all; the
	 * deadline grows with the batch (redis/pipeline.c).
	 */
	if (ncalls > 0)
		(void) redis_run_scripts(calls, ncalls, 0, &failure);
	for (int n = 0; n < ncalls; n++)
	{
		RedisCall  *call = &calls[n];
		const DecisionRequest *request = &requests[asked[n]];
		Decision   *decision = &decisions[asked[n]];
		RedisFailure outcome = call->failure.kind != REDIS_FAILURE_NONE ? call->failure : failure;
		bool		answered = call->answered &&
			decision_from_reply(call->results, decision, &outcome);

		engine_observe_redis(&request->policy, answered, &outcome, call->round_trip_us);
		decision_remember_denial(request, decision);
		if (!answered)
			decision_by_fail_mode(request, call->retry_after_ms, decision);
	}
	for (int i = 0; i < count; i++)
	{
		if (requests[i].mode != BUCKET_REFUND)
			decision_shadow(&requests[i].policy, &decisions[i]);
		if (requests[i].mode == BUCKET_TAKE)
			engine_observe_decision(&requests[i], &decisions[i], requests[i].cost);
	}
	pfree(calls);
	pfree(asked);
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
