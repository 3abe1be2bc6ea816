/*
 * decision.c
 *	  One rate limit decision: a checked request runs its algorithm's script
 *	  in Redis, or falls back to the policy's fail mode when Redis cannot
 *	  answer; fixed answers (a disabled policy, an 'allow' or 'deny' override)
 *	  and shadow mode on top.
 */
#include "prelude.h"

#include "common/hashfn.h"
#include "miscadmin.h"

#include "base/clock.h"
#include "engine/decision.h"
#include "engine/denial.h"
#include "engine/observer.h"
#include "local/buckets.h"
#include "local/slices.h"
#include "policy/subject.h"
#include "redis/breaker.h"
#include "scripts.h"

/* Forgets a bucket (or a lease set), whatever the algorithm. */
static const LuaScript reset_script = LUA_SCRIPT("reset", script_reset);

/* True when the policy's local bucket can decide this request while Redis cannot. */
bool
decision_local_possible(const DecisionRequest *request)
{
	const Policy *policy = &request->policy;

	return policy->fail_mode == FAIL_MODE_LOCAL && local_available() &&
		policy->local_usable && request->cost <= policy->local_bucket.capacity;
}

/* Applies request to its local bucket in mode. */
void
decision_local(const DecisionRequest *request, BucketMode mode, Decision *decision)
{
	BucketResult result;
	const BucketParams *params = &request->policy.local_bucket;
	/* A window's refund goes to its take's window; a bucket refills until now. */
	int64		now_ms = mode == BUCKET_REFUND && !limit_refills(params->algorithm) ?
		request_at_ms(request) : clock_now_ms();
	LocalKey	key = request_local_key(request);

	local_apply(params, &key, now_ms, Min(request->cost, params->capacity), mode, &result);
	decision->allowed = result.allowed;
	decision->remaining = result.remaining;
	decision->retry_after_ms = result.retry_after_ms;
	decision->reset_after_ms = result.reset_after_ms;
	decision->source = DECISION_SOURCE_LOCAL;
}

/*
 * When Redis could not run the script on the request's own values (a Lua
 * error): decision is a denial that asked no fail mode, marked so that the
 * caller raises it (decision_raise_script_error) once what it must keep is
 * kept; true then. A fail mode stands in for Redis, never for an error the
 * request caused: 'open' would grant without counting, however often.
 */
bool
decision_script_failed(const Policy *policy, const RedisFailure *failure, Decision *decision)
{
	if (failure->kind != REDIS_FAILURE_SCRIPT)
		return false;
	decision->allowed = false;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
	strlcpy(decision->script_error, failure->detail, sizeof(decision->script_error));
	return true;
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

/* Fills decision from the policy's fail mode, for when Redis could not decide. */
void
decision_by_fail_mode(const DecisionRequest *request, int64 retry_after_ms, Decision *decision)
{
	const Policy *policy = &request->policy;

	if (request->mode == BUCKET_REFUND)
	{
		/* Only a bucket that can be reached can be refunded: nothing was given back. */
		decision->allowed = false;
		decision->retry_after_ms = retry_after_ms;
		decision->source = DECISION_SOURCE_FAIL_CLOSED;
		return;
	}
	if (policy->fail_mode == FAIL_MODE_OPEN)
	{
		decision->allowed = true;
		decision->source = DECISION_SOURCE_FAIL_OPEN;
		return;
	}
	if (decision_local_possible(request))
	{
		decision_local(request, request->mode, decision);
		return;
	}
	/* 'closed', and 'local' where no local bucket can decide (no preload, cost too high). */
	decision->allowed = false;
	decision->retry_after_ms = retry_after_ms;
	decision->reset_after_ms = decision->retry_after_ms;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
}

/* The Redis key of request's bucket: the one fixed in advance, or built now (palloc'd). */
const char *
decision_key(const DecisionRequest *request)
{
	StringInfoData key;

	if (request->key != NULL)
		return request->key;
	initStringInfo(&key);
	subject_build_key(&key, &request->policy, request->subject, request->length);
	return key.data;
}

/*
 * Fills call with the script of request's algorithm and mode: its keys (a
 * refund's mark after them), the clock and the algorithm's numbers, and room
 * for the reply, all allocated in the current memory context. (At most 10
 * arguments: a Redis that wants a password we were not given answers NOAUTH
 * only to at most 10, and NOAUTH is what says why. A slice's take has 11, but
 * only a subject that Redis granted before is sliced.)
 */
void
decision_redis_call(const DecisionRequest *request, RedisCall *call)
{
	const BucketParams *params = &request->policy.bucket;
	const char *key = decision_key(request);
	const char *mark = NULL;
	LimitCall	part = {0};
	const char **keys;
	const char **args;

	/* A refund with an id is done once: its mark shares the bucket's hash tag. */
	if (request->refund_id != NULL)
		mark = psprintf("%s:refund:%s", key, request->refund_id);
	limit_ops(params)->call(params, request->mode, key, request->cost, request_at_ms(request),
							mark, &part);
	keys = palloc(part.nkeys * sizeof(char *));
	args = palloc((2 + part.nargs) * sizeof(char *));
	memcpy(keys, part.keys, part.nkeys * sizeof(char *));
	args[0] = clock_test_ms();
	memcpy(&args[1], part.args, part.nargs * sizeof(char *));
	/* A slice's take: the take's numbers and the most to take. */
	if (request->mode == BUCKET_SLICE)
		args[1 + part.nargs++] = psprintf(INT64_FORMAT, request->slice_most);

	memset(call, 0, sizeof(*call));
	call->script = part.script;
	call->nkeys = part.nkeys;
	call->keys = keys;
	call->nargs = 1 + part.nargs;
	call->args = args;
	call->nresults = 4;
	call->results = palloc(4 * sizeof(long long));
}

/*
 * Fills decision from a script's four numbers {allowed, remaining, retry_after_ms,
 * reset_after_ms}; false, with a protocol failure, when they make no sense.
 */
bool
decision_from_reply(const long long *results, Decision *decision, RedisFailure *failure)
{
	if (results[1] < 0 || results[2] < 0 || results[3] < 0)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	decision->allowed = results[0] == 1;
	decision->remaining = results[1];
	decision->retry_after_ms = results[2];
	decision->reset_after_ms = results[3];
	decision->source = DECISION_SOURCE_REDIS;
	return true;
}

/* One call to Redis: what to send, and what came back. */
typedef struct RedisAsk
{
	RedisCall	call;
	Decision   *decision;		/* NULL: no decision to fill (a reset) */
} RedisAsk;

/* Runs ask's call; true when Redis answered (and the decision, if any, is filled). */
static bool
ask_redis(void *arg, RedisFailure *failure)
{
	RedisAsk   *ask = arg;

	if (!redis_run_scripts(&ask->call, 1, 0, failure))
		return false;
	*failure = ask->call.failure;
	return ask->call.answered &&
		(ask->decision == NULL || decision_from_reply(ask->call.results, ask->decision, failure));
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

/* Fills decision from a grant of the subject's slice here. */
static void
decision_from_slice(const AllowancePlan *plan, const SliceGrant *grant, Decision *decision)
{
	decision->allowed = true;
	/* What Redis had left when the slice was taken, and what the slice still holds. */
	decision->remaining = grant->remaining + grant->left;
	decision->retry_after_ms = 0;
	decision->reset_after_ms = Max(grant->reset_until_ms - plan->ask.now_ms, 0);
	decision->source = DECISION_SOURCE_ALLOWANCE;
}

/*
 * Decides a checked take here, without Redis, when it can: from the
 * subject's slice (tokens already taken from Redis: before a denial
 * remembered), or from a denial remembered; true then. Else plan says what
 * to ask Redis, with the slices to give back first in backs. single: a take
 * alone, which may fetch its subject's slice and wait for another backend's
 * fetch of it; a batch does neither (it would hold the subject's fetch for
 * its whole round trip, and cannot wait for itself).
 */
bool
decision_here(const DecisionRequest *request, bool single, AllowancePlan *plan,
			  SliceGiveBack *backs, int *nbacks, Decision *decision)
{
	SliceGrant	grant;
	SliceOutcome outcome;

	*nbacks = 0;
	if (allowance_grant(request, single, plan, &grant))
	{
		decision_from_slice(plan, &grant, decision);
		return true;
	}
	if (denial_answer(request, decision))
		return true;
	outcome = allowance_plan(plan, &grant, backs, nbacks);
	if (outcome == SLICE_WAIT && single)
	{
		/* The fetch's tokens, or the denial it met, answer this take once it ends. */
		allowance_wait(plan);
		if (allowance_grant(request, single, plan, &grant))
		{
			decision_from_slice(plan, &grant, decision);
			return true;
		}
		if (denial_answer(request, decision))
			return true;
		outcome = allowance_plan(plan, &grant, backs, nbacks);
	}
	if (outcome == SLICE_GRANTED)
	{
		decision_from_slice(plan, &grant, decision);
		return true;
	}
	return false;
}

/* The refund of a slice's tokens not granted, as a call. */
void
decision_give_back_call(const SliceGiveBack *back, RedisCall *call)
{
	DecisionRequest request;

	allowance_give_back_request(back, &request);
	decision_redis_call(&request, call);
}

/* Gives slices' tokens back to Redis now (a slice fetched while another was). */
void
decision_give_back(const SliceGiveBack *backs, int nbacks)
{
	RedisCall  *calls = palloc0(Max(nbacks, 1) * sizeof(RedisCall));
	RedisFailure failure;

	for (int i = 0; i < nbacks; i++)
		decision_give_back_call(&backs[i], &calls[i]);
	/* Tokens that cannot be given back are lost, never granted twice. */
	if (nbacks > 0)
		(void) redis_run_scripts(calls, nbacks, 0, &failure);
	pfree(calls);
}

/*
 * Asks Redis for request (a slice of it when plan says so), with the slices
 * in backs given back first in the same round trip, and fills decision: by
 * Redis, or by the fail mode.
 */
static void
decide_by_redis(const DecisionRequest *request, AllowancePlan *plan, const SliceGiveBack *backs,
				int nbacks, Decision *decision)
{
	RedisCall	calls[1 + SLICE_MAX_GIVEBACKS];
	RedisCall  *call = &calls[nbacks];
	DecisionRequest sent = *request;
	RedisFailure failure = {0};
	RedisFailure outcome;
	SliceGiveBack back;
	bool		answered;
	int64		asked_us;

	for (int i = 0; i < nbacks; i++)
		decision_give_back_call(&backs[i], &calls[i]);
	sent.key = decision_key(request);
	allowance_request(plan, &sent);
	decision_redis_call(&sent, call);
	/* While its node's breaker is open, Redis is not asked at all. */
	asked_us = clock_monotonic_us();
	(void) redis_run_scripts(calls, nbacks + 1, 0, &failure);
	outcome = call->failure.kind != REDIS_FAILURE_NONE ? call->failure : failure;
	answered = call->answered && allowance_reply(plan, call->results, &outcome) &&
		decision_from_reply(call->results, decision, &outcome);
	engine_observe_redis(&request->policy, answered, &outcome, call->round_trip_us);
	if (allowance_after(plan, sent.key, answered, answered && decision->allowed,
						&decision->remaining, decision->reset_after_ms, &back))
		decision_give_back(&back, 1);
	denial_learn(request, decision, asked_us);
	if (!answered && !decision_script_failed(&request->policy, &outcome, decision))
		decision_by_fail_mode(request, call->retry_after_ms, decision);
}

/*
 * Runs a checked request: a fixed answer, the subject's slice here (tokens
 * already taken from Redis: before a denial remembered), a denial
 * remembered, else Redis while it answers, else the policy's fail mode.
 */
void
decision_run(const DecisionRequest *request, Decision *decision)
{
	const Policy *policy = &request->policy;
	AllowancePlan plan = {0};
	SliceGiveBack backs[SLICE_MAX_GIVEBACKS];
	int			nbacks = 0;

	decision_init(policy, decision);
	/* A fetch of a slice begun here ends here, whatever is raised meanwhile. */
	PG_TRY();
	{
		/* A refund goes to the bucket whatever answers decisions. */
		if (request->mode == BUCKET_REFUND ||
			(!decision_fixed(policy, decision) &&
			 !decision_here(request, true, &plan, backs, &nbacks, decision)))
			decide_by_redis(request, &plan, backs, nbacks, decision);
	}
	PG_CATCH();
	{
		allowance_abandon(&plan);
		PG_RE_THROW();
	}
	PG_END_TRY();
	decision_raise_script_error(decision);
	if (request->mode != BUCKET_REFUND)
		decision_shadow(policy, decision);
	if (request->mode == BUCKET_TAKE)
		engine_observe_decision(request, decision, request->cost);
}

/*
 * Forgets the request's bucket (or lease set) in Redis, a full one again;
 * false when Redis could not answer. The local bucket, if any, is left alone.
 */
bool
decision_reset(const DecisionRequest *request)
{
	const BucketParams *params = &request->policy.bucket;
	const char **keys = palloc(LIMIT_MAX_KEYS * sizeof(char *));
	RedisAsk	ask = {0};
	RedisFailure failure;
	bool		answered;
	LocalKey	local_key;

	ask.call.script = &reset_script;
	ask.call.nkeys = limit_ops(params)->reset_keys(params, decision_key(request),
												   request_at_ms(request), keys);
	ask.call.keys = keys;
	ask.call.nresults = 1;
	ask.call.results = palloc(sizeof(long long));
	answered = ask_redis(&ask, &failure);
	engine_observe_redis(&request->policy, answered, &failure, ask.call.round_trip_us);
	/* A denial remembered for it is forgotten, whatever Redis said; so is a slice held here. */
	denial_forget(request);
	local_key = request_local_key(request);
	slices_forget(&local_key);
	return answered;
}

/* Gives a request's tokens back to its local bucket (a reservation granted there). */
void
decision_refund_local(const DecisionRequest *request)
{
	Decision	decision;

	if (local_available() && request->policy.local_usable)
		decision_local(request, BUCKET_REFUND, &decision);
}

/*
 * Milliseconds as whole seconds, rounded up: a client told to wait less than
 * the bucket needs would only be denied again. Negative counts as 0.
 */
int64
decision_seconds_up(int64 ms)
{
	if (ms <= 0)
		return 0;
	/* Not (ms + 999) / 1000, which overflows near INT64_MAX. */
	return ms / 1000 + (ms % 1000 != 0);
}

/* A denial's retry-after in whole seconds: at least 1, since 0 invites an immediate retry. */
int64
decision_retry_after_seconds(const Decision *decision)
{
	return Max(decision_seconds_up(decision->retry_after_ms), 1);
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

/* The source column's text. */
const char *
decision_source_name(DecisionSource source)
{
	switch (source)
	{
		case DECISION_SOURCE_REDIS:
			return "redis";
		case DECISION_SOURCE_LOCAL:
			return "local";
		case DECISION_SOURCE_FAIL_OPEN:
			return "fail_open";
		case DECISION_SOURCE_SHADOW:
			return "shadow";
		case DECISION_SOURCE_DISABLED:
			return "disabled";
		case DECISION_SOURCE_OVERRIDE:
			return "override";
		case DECISION_SOURCE_DENY_CACHE:
			return "deny_cache";
		case DECISION_SOURCE_ALLOWANCE:
			return "allowance";
		case DECISION_SOURCE_FAIL_CLOSED:
			break;
	}
	return "fail_closed";
}
