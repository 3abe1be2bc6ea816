/*
 * decide.c
 *	  Decisions as one pipeline of three stages, the same for a take alone
 *	  (rl_consume, rl_enforce, rl_peek, rl_refund) and for a batch
 *	  (rl_consume_many, rl_reserve, the triggers): a take alone is a batch of
 *	  one.
 *
 *	  begin   a fixed answer (a disabled policy, an override), a grant from
 *	          the subject's slice here, a denial remembered, or a call
 *	          planned for Redis (a slice to fetch, or the cost alone);
 *	  call    every planned call in one round trip per Redis node, the
 *	          slices to give back first (a slice taken after them may take
 *	          their tokens again);
 *	  finish  the reply read into the decision, what shared memory learns
 *	          from it (a slice installed, a denial remembered), the fail mode
 *	          when Redis did not answer, then shadow mode and observation.
 *
 * A Deciding carries what the stages compute, each fact once: the Redis key,
 * the subject's shared-memory key, the clock, the time the request counts at.
 */
#include "prelude.h"

#include "base/clock.h"
#include "engine/allowance.h"
#include "engine/ask.h"
#include "engine/booking.h"
#include "engine/decide.h"
#include "engine/region.h"
#include "engine/denial.h"
#include "engine/observer.h"
#include "local/slices.h"
#include "policy/subject.h"

/* One request on its way through the stages. */
typedef struct Deciding
{
	const DecisionRequest *request;
	Decision   *decision;
	LocalKey	local_key;		/* the subject in shared memory */
	int64		now_ms;			/* this server's clock when it began (or last waited) */
	int64		at_ms;			/* the time it counts at: a window's the request's, else now */
	AllowancePlan plan;
	const char *key;			/* the Redis key, when Redis is asked */
} Deciding;

/* Slices whose tokens go back to Redis, as a growing array. */
typedef struct GiveBacks
{
	SliceGiveBack *backs;
	int			count;
	int			room;
} GiveBacks;

/* Makes room in backs for SLICE_MAX_GIVEBACKS more. */
static void
give_backs_room(GiveBacks *backs)
{
	if (backs->count + SLICE_MAX_GIVEBACKS <= backs->room)
		return;
	backs->room = Max(backs->room * 2, backs->count + SLICE_MAX_GIVEBACKS);
	backs->backs = backs->backs == NULL ? palloc(backs->room * sizeof(SliceGiveBack)) :
		repalloc(backs->backs, backs->room * sizeof(SliceGiveBack));
}

/* The call that gives back's tokens back to the bucket (and window) they came from. */
static void
give_back_call(const SliceGiveBack *back, RedisCall *call)
{
	LimitCall	part = {0};

	limit_give_back_call(&back->params, back->key, back->tokens, back->taken_ms, &part);
	ask_call_of(&part, NULL, 0, 4, call);
}

/* Gives slices' tokens back to Redis now, in one round trip; what cannot be is lost, never granted twice. */
static void
give_back(const GiveBacks *backs)
{
	RedisCall  *calls;
	RedisFailure failure;

	if (backs->count == 0)
		return;
	calls = palloc0(backs->count * sizeof(RedisCall));
	for (int i = 0; i < backs->count; i++)
		give_back_call(&backs->backs[i], &calls[i]);
	(void) redis_run_scripts(calls, backs->count, 0, &failure);
	pfree(calls);
}

/* Fills d's decision from a grant of the subject's slice here. */
static void
from_slice(Deciding *d, const SliceGrant *grant)
{
	Decision   *decision = d->decision;

	decision->allowed = true;
	/* What Redis had left when the slice was taken, and what the slice still holds. */
	decision->remaining = grant->remaining + grant->left;
	decision->retry_after_ms = 0;
	decision->reset_after_ms = Max(grant->reset_until_ms - d->now_ms, 0);
	decision->source = DECISION_SOURCE_ALLOWANCE;
}

/* Fills the parts of decision that do not depend on who decides: policy, version, capacity. */
void
decision_init(const Policy *policy, Decision *decision)
{
	memset(decision, 0, sizeof(*decision));
	strlcpy(decision->policy, policy->name, sizeof(decision->policy));
	decision->version = policy->version;
	decision->capacity = policy->bucket.capacity;
}

/* True when decisions of policy (a request's copy) need no bucket: see decision_fixed. */
bool
decision_needs_no_bucket(const Policy *policy)
{
	return policy->mode == POLICY_MODE_DISABLED || policy->override == OVERRIDE_ALLOW ||
		policy->override == OVERRIDE_DENY;
}

/*
 * For a decision that needs no bucket, fills it and returns true: a disabled
 * policy allows and counts nothing; an 'allow' override allows and a 'deny'
 * override denies (until it expires), counting nothing. The caller applies the
 * shadow mode afterwards.
 */
bool
decision_fixed(const Policy *policy, Decision *decision)
{
	if (!decision_needs_no_bucket(policy))
		return false;
	decision->allowed = policy->override != OVERRIDE_DENY || policy->mode == POLICY_MODE_DISABLED;
	decision->remaining = decision->allowed ? policy->bucket.capacity : 0;
	decision->retry_after_ms = decision->allowed ? 0 : policy->override_retry_ms;
	decision->reset_after_ms = 0;
	decision->source = policy->mode == POLICY_MODE_DISABLED ?
		DECISION_SOURCE_DISABLED : DECISION_SOURCE_OVERRIDE;
	return true;
}

/* For a shadow policy, turns a denial into a grant whose source says it would have denied. */
void
decision_shadow(const Policy *policy, Decision *decision)
{
	if (policy->mode == POLICY_MODE_SHADOW && !decision->allowed &&
		decision->script_error[0] == '\0')
	{
		decision->allowed = true;
		decision->origin = decision->source;
		decision->source = DECISION_SOURCE_SHADOW;
	}
}

/* Raises the error of a decision whose script failed on the request's values, if it did. */
void
decision_raise_script_error(const Decision *decision)
{
	if (decision->script_error[0] == '\0')
		return;
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("Redis could not run the script of rate limit policy \"%s\" for this request",
					decision->policy),
			 errdetail("The script failed: %s.", decision->script_error),
			 errhint("This is a limit of ratelimit, not of the policy: report it with the policy's algorithm, capacity and the cost.")));
}

/* Reads the clock into d: now, and the time its request counts at. */
static void
read_clock(Deciding *d)
{
	d->now_ms = clock_now_ms();
	d->at_ms = request_counts_at_ms(d->request, d->now_ms);
}

/* Plans d's call to Redis: false, for begin to return. */
static bool
planned(Deciding *d)
{
	d->key = decision_key(d->request);
	return false;
}

/*
 * The first stage: true when d is decided without Redis (a fixed answer, the
 * subject's slice, a denial remembered); else its call is planned, with the
 * slices to give back first added to backs. alone: a take by itself, which
 * may fetch its subject's slice and wait for another backend's fetch of it;
 * a batch does neither (it would hold the subject's fetch for its whole
 * round trip, and cannot wait for itself).
 */
static bool
begin(Deciding *d, bool alone, GiveBacks *backs)
{
	const DecisionRequest *request = d->request;
	SliceGrant	grant;
	SliceOutcome outcome;
	int			more = 0;

	decision_init(&request->policy, d->decision);
	/* A refund goes to the bucket whatever answers decisions. */
	if (request->mode != LIMIT_REFUND && decision_fixed(&request->policy, d->decision))
		return true;
	d->local_key = request_local_key(request);
	read_clock(d);
	/* A wait is booked, a request id remembered, a debt owed in Redis: no slice, no denial remembered. */
	if (request->max_wait_ms > 0 || request->request_id != NULL || request->mode == LIMIT_OWE)
		return planned(d);
	if (request->mode != LIMIT_REFUND)
	{
		/* The slice first: its tokens were taken from Redis before any denial remembered. */
		if (allowance_grant(request, &d->local_key, d->at_ms, alone, &d->plan, &grant))
		{
			from_slice(d, &grant);
			return true;
		}
		if (denial_answer(request, &d->local_key, d->now_ms, d->decision))
			return true;
		/* A take that can use no slice (plan.request NULL) is planned as it is. */
		if (d->plan.request == NULL)
			return planned(d);
		give_backs_room(backs);
		outcome = allowance_plan(&d->plan, &grant, &backs->backs[backs->count], &more);
		if (outcome == SLICE_WAIT && alone)
		{
			/* The fetch's tokens, or the denial it met, answer this take once it ends. */
			allowance_wait(&d->plan);
			read_clock(d);
			if (allowance_grant(request, &d->local_key, d->at_ms, alone, &d->plan, &grant))
			{
				from_slice(d, &grant);
				return true;
			}
			if (denial_answer(request, &d->local_key, d->now_ms, d->decision))
				return true;
			outcome = allowance_plan(&d->plan, &grant, &backs->backs[backs->count], &more);
		}
		backs->count += more;
		if (outcome == SLICE_GRANTED)
		{
			from_slice(d, &grant);
			return true;
		}
	}
	return planned(d);
}

/*
 * The second stage: the calls of every d that asks Redis (asking[0 ..
 * nasking)), after the slices in backs, in one round trip per node (while a
 * node's breaker is open, its calls are not sent at all; the deadline grows
 * with the calls: redis/pipeline.c). Returns the calls, backs' first.
 */
static RedisCall *
call(Deciding **asking, int nasking, const GiveBacks *backs, RedisFailure *failure)
{
	RedisCall  *calls = palloc0(Max(backs->count + nasking, 1) * sizeof(RedisCall));

	for (int b = 0; b < backs->count; b++)
		give_back_call(&backs->backs[b], &calls[b]);
	for (int n = 0; n < nasking; n++)
	{
		Deciding   *d = asking[n];
		bool		fetch = d->plan.outcome == SLICE_FETCH;

		if (region_splits(d->request))
			region_share_call(d->request, d->key, d->at_ms, &calls[backs->count + n]);
		else
			ask_call(d->request, fetch ? LIMIT_SLICE : d->request->mode, d->key, d->at_ms,
					 d->plan.want, &calls[backs->count + n]);
	}
	memset(failure, 0, sizeof(*failure));
	if (backs->count + nasking > 0)
		(void) redis_run_scripts(calls, backs->count + nasking, 0, failure);
	return calls;
}

/*
 * The third stage, for a d that asked Redis (asked at asked_us,
 * clock_monotonic_us): its decision from the reply, what the slice and the
 * deny cache learn from it, else its fail mode. A slice fetched while
 * another was installed goes to lates, to be given back.
 */
static void
finish(Deciding *d, RedisCall *call, const RedisFailure *failure, int64 asked_us,
	   GiveBacks *lates)
{
	const DecisionRequest *request = d->request;
	Decision   *decision = d->decision;
	RedisFailure outcome;
	bool		fetch = d->plan.outcome == SLICE_FETCH;
	bool		answered;

	/* A split policy's share may lack the cost: a lease from the home region then. */
	if (call->answered && region_splits(request))
		region_share_finish(request, d->key, d->at_ms, call);
	outcome = call->failure.kind != REDIS_FAILURE_NONE ? call->failure : *failure;
	answered = call->answered &&
		(d->plan.request == NULL || allowance_reply(&d->plan, call->results, &outcome)) &&
		decision_from_reply(call->results, fetch, decision, &outcome) &&
		ask_reply_extras(d->request, call, decision, &outcome);
	engine_observe_redis(&request->policy, answered, &outcome, call->round_trip_us);
	if (d->plan.request != NULL)
	{
		give_backs_room(lates);
		if (allowance_after(&d->plan, d->key, answered, answered && decision->allowed,
							&decision->remaining, decision->reset_after_ms,
							&lates->backs[lates->count]))
			lates->count++;
	}
	denial_learn(request, &d->local_key, decision, asked_us);
	/* A script's failure is raised by the caller, once every decision is kept. */
	if (!answered && !decision_script_failed(&request->policy, &outcome, decision))
	{
		/* A local bucket decides at the time Redis failed, not at the time it was asked. */
		read_clock(d);
		decision_by_fail_mode(request, &d->local_key, d->at_ms, call->retry_after_ms, decision);
	}
}

/*
 * After the stages, for the takes of ds[0 .. count) granted ahead of now (a
 * wait booked, or the replay of one): waits until their time, giving back
 * what this call booked if it is cancelled (booking.c). A fixed window's
 * booking is in the window after the one it was asked in, and goes back there.
 */
static void
await_bookings(Deciding *ds, int count)
{
	Booking    *bookings = NULL;
	int			nbookings = 0;

	for (int i = 0; i < count; i++)
	{
		Decision   *decision = ds[i].decision;
		DecisionRequest back;

		if (!decision->allowed || decision->wait_ms == 0)
			continue;
		if (bookings == NULL)
			bookings = palloc0(count * sizeof(Booking));
		bookings[nbookings].decision = decision;
		/* A replay booked nothing: it waits for the turn its first asking booked. */
		if (decision->source != DECISION_SOURCE_REPLAY)
		{
			back = *ds[i].request;
			back.mode = LIMIT_REFUND;
			back.max_wait_ms = 0;
			back.refund_id = clock_unique_id();
			ask_call(&back, LIMIT_REFUND, ds[i].key,
					 limit_booked_at_ms(&back.policy.bucket, ds[i].at_ms), 0,
					 &bookings[nbookings].give_back);
		}
		nbookings++;
	}
	if (nbookings > 0)
		booking_await(bookings, nbookings);
}

/* Runs the three stages for ds[0 .. count); alone: see begin. */
static void
decide(Deciding *ds, int count, bool alone)
{
	Deciding  **asking = palloc(Max(count, 1) * sizeof(Deciding *));
	int			nasking = 0;
	GiveBacks	backs = {0};
	GiveBacks	lates = {0};
	RedisFailure failure;
	RedisCall  *calls;
	int64		asked_us;

	for (int i = 0; i < count; i++)
		if (!begin(&ds[i], alone, &backs))
			asking[nasking++] = &ds[i];
	asked_us = clock_monotonic_us();
	calls = call(asking, nasking, &backs, &failure);
	for (int n = 0; n < nasking; n++)
		finish(asking[n], &calls[backs.count + n], &failure, asked_us, &lates);
	/* Slices fetched while another was (rare): given back once every slice is in. */
	give_back(&lates);
	await_bookings(ds, count);
	for (int i = 0; i < count; i++)
	{
		const DecisionRequest *request = ds[i].request;

		if (request->mode != LIMIT_REFUND)
			decision_shadow(&request->policy, ds[i].decision);
		/* A take alone whose script failed raises its error instead: nothing was decided. */
		if (request->mode == LIMIT_TAKE && !(alone && ds[i].decision->script_error[0] != '\0'))
			engine_observe_decision(request, ds[i].decision, request->cost);
	}
	pfree(calls);
	pfree(asking);
	if (backs.backs != NULL)
		pfree(backs.backs);
	if (lates.backs != NULL)
		pfree(lates.backs);
}

/*
 * Decides requests[0 .. count) into decisions through the stages; a fetch of
 * a slice begun here ends here, whatever is raised meanwhile.
 */
static void
decide_all(const DecisionRequest *requests, Decision *decisions, int count, bool alone)
{
	Deciding   *ds = palloc0(Max(count, 1) * sizeof(Deciding));

	for (int i = 0; i < count; i++)
	{
		ds[i].request = &requests[i];
		ds[i].decision = &decisions[i];
	}
	PG_TRY();
	{
		decide(ds, count, alone);
	}
	PG_CATCH();
	{
		for (int i = 0; i < count; i++)
			allowance_abandon(&ds[i].plan);
		PG_RE_THROW();
	}
	PG_END_TRY();
	pfree(ds);
}

/*
 * Runs a checked request (a take, peek or refund): a fixed answer, the
 * subject's slice here, a denial remembered, else Redis while it answers,
 * else the policy's fail mode; an error when the script failed on the
 * request's own values.
 */
void
decision_run(const DecisionRequest *request, Decision *decision)
{
	decide_all(request, decision, 1, true);
	decision_raise_script_error(decision);
}

/*
 * Decides count checked requests (each a take, peek or refund) into
 * decisions, each exactly as decision_run would but never fetching a slice:
 * BATCH_MAX_DECISIONS at a time, each in one round trip per node. The caller
 * raises a script's failure, once what it must keep is kept.
 */
void
batch_run(const DecisionRequest *requests, Decision *decisions, int count)
{
	for (int done = 0; done < count; done += BATCH_MAX_DECISIONS)
		decide_all(&requests[done], &decisions[done], Min(count - done, BATCH_MAX_DECISIONS),
				   false);
}

/*
 * Forgets the request's bucket (or lease set) in Redis, a full one again;
 * false when Redis could not answer. A denial remembered for it and a slice
 * held here are forgotten, whatever Redis said; the local bucket is left
 * alone.
 */
bool
decision_reset(const DecisionRequest *request)
{
	LimitCall	part = {0};
	RedisCall	reset;
	RedisFailure failure;
	bool		answered;
	LocalKey	local_key = request_local_key(request);

	limit_reset_call(&request->policy.bucket, decision_key(request), request_at_ms(request), &part);
	memset(&reset, 0, sizeof(reset));
	reset.script = part.script;
	reset.target = request->target;
	reset.nkeys = part.nkeys;
	reset.keys = part.keys;
	reset.nresults = 1;
	reset.results = palloc(sizeof(long long));
	answered = redis_run_scripts(&reset, 1, 0, &failure);
	if (answered)
		failure = reset.failure;
	answered = answered && reset.answered;
	engine_observe_redis(&request->policy, answered, &failure, reset.round_trip_us);
	denial_forget(request, &local_key);
	slices_forget(&local_key);
	return answered;
}
