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
#include "engine/booking.h"
#include "engine/decide.h"
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

/* The Redis key of request's bucket: the one fixed in advance, or built now (palloc'd). */
const char *
decision_key(const DecisionRequest *request)
{
	StringInfoData key;

	if (request->redis_key != NULL)
		return request->redis_key;
	initStringInfo(&key);
	subject_build_key(&key, &request->policy, request->subject, request->length);
	return key.data;
}

/*
 * Fills call from an algorithm's script, keys and numbers: the clock first
 * (a test clock, or Redis's), then the nextras numbers of extras (a slice's
 * most to take, a booking's wait and debt); room for nresults numbers of the
 * reply. All allocated in the current memory context. (At most 10
 * arguments: a Redis that wants a password we were not given answers NOAUTH
 * only to at most 10, and NOAUTH is what says why. A slice's take has 11, but
 * only a subject that Redis granted before is sliced.)
 */
static void
call_of(const LimitCall *part, const int64 *extras, int nextras, int nresults, RedisCall *call)
{
	const char **keys = palloc(Max(part->nkeys, 1) * sizeof(char *));
	const char **args = palloc((1 + part->nargs + nextras) * sizeof(char *));
	int			nargs = 0;

	memcpy(keys, part->keys, part->nkeys * sizeof(char *));
	args[nargs++] = clock_test_ms();
	memcpy(&args[nargs], part->args, part->nargs * sizeof(char *));
	nargs += part->nargs;
	for (int i = 0; i < nextras; i++)
		args[nargs++] = psprintf(INT64_FORMAT, extras[i]);
	memset(call, 0, sizeof(*call));
	call->script = part->script;
	call->nkeys = part->nkeys;
	call->keys = keys;
	call->nargs = nargs;
	call->args = args;
	call->nresults = nresults;
	call->results = palloc(nresults * sizeof(long long));
}

/* The Redis key that remembers a grant of request (lua/once.lua): beside key, in its slot. */
static const char *
request_key(const DecisionRequest *request, const char *key)
{
	return psprintf("%s:request:%s", key, request->request_id);
}

/* The script mode of a call of request in mode: a take that may wait books. */
static LimitMode
script_mode(const DecisionRequest *request, LimitMode mode)
{
	return mode == LIMIT_TAKE && request->max_wait_ms > 0 ? LIMIT_BOOK : mode;
}

/* True when a call of request in mode is made once per request id. */
static bool
made_once(const DecisionRequest *request, LimitMode mode)
{
	return mode == LIMIT_TAKE && request->request_id != NULL;
}

/*
 * Fills call with the script of request's algorithm and mode at at_ms, on
 * key: a refund with an id has its mark after it (sharing its hash tag), then
 * the request id it forgets; a take that may wait books (its wait and the
 * policy's debt follow its numbers); a take with a request id is made once
 * (the id's key and memory follow). Its reply: 4 numbers, then the wait a
 * booking answers (a take made once: 0 when it books nothing), then whether
 * a take made once was a replay.
 */
static void
request_call(const DecisionRequest *request, LimitMode mode, const char *key, int64 at_ms,
			 int64 slice_most, RedisCall *call)
{
	const LimitParams *params = &request->policy.bucket;
	LimitMode	script = script_mode(request, mode);
	const char *mark = NULL;
	LimitCall	part = {0};
	int64		extras[3];
	int			nextras = 0;
	int			nresults = 4;

	if (request->refund_id != NULL)
		mark = psprintf("%s:refund:%s", key, request->refund_id);
	limit_ops(params)->call(params, script, key, request->cost, at_ms, mark, &part);
	if (mode == LIMIT_REFUND && mark != NULL && request->request_id != NULL)
		part.keys[part.nkeys++] = request_key(request, key);
	if (script == LIMIT_SLICE)
		extras[nextras++] = slice_most;
	if (script == LIMIT_BOOK)
	{
		extras[nextras++] = request->max_wait_ms;
		nresults++;
	}
	if (script == LIMIT_BOOK || script == LIMIT_OWE)
		extras[nextras++] = policy_max_debt(&request->policy);
	if (made_once(request, mode))
	{
		Assert(part.script->once != NULL);
		part.script = part.script->once;
		part.keys[part.nkeys++] = request_key(request, key);
		extras[nextras++] = request->policy.replay_window_ms;
		nresults = 6;
	}
	call_of(&part, extras, nextras, nresults, call);
}

/* The call of request as it is, at its own time (a reservation's refund at its end). */
void
decision_redis_call(const DecisionRequest *request, RedisCall *call)
{
	request_call(request, request->mode, decision_key(request), request_at_ms(request), 0, call);
}

/* The call that gives back's tokens back to the bucket (and window) they came from. */
static void
give_back_call(const SliceGiveBack *back, RedisCall *call)
{
	LimitCall	part = {0};

	limit_give_back_call(&back->params, back->key, back->tokens, back->taken_ms, &part);
	call_of(&part, NULL, 0, 4, call);
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

/*
 * Fills decision from a script's four numbers {allowed, remaining,
 * retry_after_ms, reset_after_ms} (a slice's first is the tokens it took: 0
 * denies); false, with a protocol failure, when they make no sense.
 */
bool
decision_from_reply(const long long *results, bool slice, Decision *decision,
					RedisFailure *failure)
{
	if (results[1] < 0 || results[2] < 0 || results[3] < 0)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	decision->allowed = slice ? results[0] > 0 : results[0] == 1;
	decision->remaining = results[1];
	decision->retry_after_ms = results[2];
	decision->reset_after_ms = results[3];
	decision->source = DECISION_SOURCE_REDIS;
	return true;
}

/*
 * Reads what follows a reply's four numbers into d's decision: a booking's
 * wait, a replay's mark (a replay waits for nothing: its first asking waited);
 * false, with a protocol failure, when they make no sense.
 */
static bool
from_reply_extras(const Deciding *d, const RedisCall *call, RedisFailure *failure)
{
	Decision   *decision = d->decision;
	long long	wait = call->nresults > 4 ? call->results[4] : 0;
	long long	replay = call->nresults > 5 ? call->results[5] : 0;

	if (wait < 0 || (!replay && wait > d->request->max_wait_ms) || (wait > 0 && !decision->allowed) ||
		replay < 0 || replay > 1)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	decision->wait_ms = replay ? 0 : wait;
	/* A settle's first number is what it took: all of the cost, or what the debt allowed. */
	if (d->request->mode == LIMIT_OWE)
		decision->allowed = call->results[0] == d->request->cost;
	if (replay)
		decision->source = DECISION_SOURCE_REPLAY;
	return true;
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

		request_call(d->request, fetch ? LIMIT_SLICE : d->request->mode, d->key, d->at_ms,
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
	RedisFailure outcome = call->failure.kind != REDIS_FAILURE_NONE ? call->failure : *failure;
	bool		fetch = d->plan.outcome == SLICE_FETCH;
	bool		answered;

	answered = call->answered &&
		(d->plan.request == NULL || allowance_reply(&d->plan, call->results, &outcome)) &&
		decision_from_reply(call->results, fetch, decision, &outcome) &&
		from_reply_extras(d, call, &outcome);
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
 * wait booked): waits until their time, giving them back if cancelled
 * (booking.c). A fixed window's booking is in the window after the one it was
 * asked in, and goes back there.
 */
static void
await_bookings(Deciding *ds, int count)
{
	Booking    *bookings = NULL;
	int			nbookings = 0;

	for (int i = 0; i < count; i++)
	{
		DecisionRequest back;

		if (!ds[i].decision->allowed || ds[i].decision->wait_ms == 0)
			continue;
		if (bookings == NULL)
			bookings = palloc(count * sizeof(Booking));
		back = *ds[i].request;
		back.mode = LIMIT_REFUND;
		back.max_wait_ms = 0;
		back.refund_id = clock_unique_id();
		bookings[nbookings].decision = ds[i].decision;
		request_call(&back, LIMIT_REFUND, ds[i].key,
					 ds[i].at_ms + (limit_refills(back.policy.algorithm) ? 0 : ds[i].decision->wait_ms),
					 0, &bookings[nbookings].give_back);
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
