/*
 * decision.c
 *	  One rate limit decision: checks the arguments, finds the policy, runs the
 *	  bucket script in Redis, and falls back to the policy's fail mode when Redis
 *	  cannot answer.
 */
#include "ratelimit.h"

#include "access/htup_details.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "breaker.h"
#include "decision.h"
#include "decision_log.h"
#include "headers.h"
#include "local.h"
#include "log_limit.h"
#include "policy.h"
#include "redis.h"
#include "scripts.h"
#include "stats.h"
#include "subject.h"

RedisScript token_bucket_script = {
	.name = "token_bucket",
	.body = script_token_bucket,
};

static RedisScript reset_script = {
	.name = "reset",
	.body = script_reset,
};

/* Whether a failure line was logged since the last "answers again" line. */
static bool failure_logged = false;

/*
 * Notes a Redis call made for policy: counts it in rl_stats, and logs Redis
 * health: a failure at most once per class and retry_interval (log_limit.c),
 * and that Redis answers again after a failure was logged. Never a key or
 * subject: the statement (which may hold the subject) is kept out of the line.
 */
void
decision_note_redis(const Policy *policy, bool answered, const RedisFailure *failure)
{
	char		line_class[128];
	int64		held_back;
	char	   *held_back_text;

	stats_redis(policy->name, answered, failure);
	/* A call the breaker skipped says nothing new. */
	if (!answered && failure->kind == REDIS_FAILURE_NONE)
		return;
	if (failure->kind == REDIS_FAILURE_NONE)
	{
		if (failure_logged)
			ereport(LOG,
					(errhidestmt(true),
					 errhidecontext(true),
					 errmsg("ratelimit: Redis answers again"),
					 errdetail("Policy \"%s\" was decided by Redis.", policy->name)));
		failure_logged = false;
		return;
	}
	snprintf(line_class, sizeof(line_class), "redis %s: %s",
			 redis_failure_kind_name(failure->kind), failure->detail);
	if (!log_limit_allow(line_class, &held_back))
		return;
	failure_logged = true;
	held_back_text = held_back == 0 ? "" :
		psprintf(" " INT64_FORMAT " more like it were not logged since the last one.", held_back);
	if (failure->kind == REDIS_FAILURE_PERMISSION)
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis refused a command: the ACL of its user does not allow %s (permission)",
						failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" while Redis refuses.%s",
						   policy->name, policy_fail_mode_name(policy->fail_mode), held_back_text),
				 errhint("Give the Redis user the commands and keys the documentation lists.")));
	else
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis cannot answer (%s: %s)",
						redis_failure_kind_name(failure->kind), failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" until Redis answers.%s",
						   policy->name, policy_fail_mode_name(policy->fail_mode), held_back_text)));
}

/* The local bucket's key: database, policy, version and subject, hashed (never 0). */
static uint64
local_key(const DecisionRequest *request)
{
	const Policy *policy = &request->policy;
	uint64		seed = hash_bytes_extended((const unsigned char *) policy->name,
										   strlen(policy->name),
										   (((uint64) MyDatabaseId << 32) | (uint32) policy->version) ^
										   policy->installation);
	uint64		key = hash_bytes_extended((const unsigned char *) request->subject,
										  request->length, seed);

	return key != 0 ? key : 1;
}

/* Copies a bucket's answer into decision. */
static void
decision_from_bucket(Decision *decision, const BucketResult *result, DecisionSource source)
{
	decision->allowed = result->allowed;
	decision->remaining = result->remaining;
	decision->retry_after_ms = result->retry_after_ms;
	decision->reset_after_ms = result->reset_after_ms;
	decision->source = source;
}

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

	local_apply(&request->policy.local_bucket, local_key(request), rl_now_ms(),
				Min(request->cost, request->policy.local_bucket.capacity), mode, &result);
	decision_from_bucket(decision, &result, DECISION_SOURCE_LOCAL);
}

/* Fills decision from the policy's fail mode, for when Redis could not decide. */
static void
decide_by_fail_mode(const DecisionRequest *request, Decision *decision)
{
	const Policy *policy = &request->policy;

	if (request->mode == BUCKET_REFUND)
	{
		/* Only a bucket that can be reached can be refunded: nothing was given back. */
		decision->allowed = false;
		decision->retry_after_ms = breaker_retry_after_ms();
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
	decision->retry_after_ms = breaker_retry_after_ms();
	decision->reset_after_ms = decision->retry_after_ms;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
}

/* A request and the decision it fills, for breaker_call. */
typedef struct RedisAsk
{
	const DecisionRequest *request;
	Decision   *decision;
} RedisAsk;

/*
 * Fills the DECISION_SCRIPT_ARGS arguments of lua/token_bucket.lua for one
 * bucket of request, printing its numbers into numbers.
 */
void
decision_script_args(const DecisionRequest *request, ScriptNumbers numbers, const char **args)
{
	const BucketParams *bucket = &request->policy.bucket;

	snprintf(numbers[0], sizeof(numbers[0]), INT64_FORMAT, bucket->capacity_units);
	snprintf(numbers[1], sizeof(numbers[1]), INT64_FORMAT, bucket->rate);
	snprintf(numbers[2], sizeof(numbers[2]), INT64_FORMAT, bucket->unit);
	snprintf(numbers[3], sizeof(numbers[3]), INT64_FORMAT, request->cost);
	snprintf(numbers[4], sizeof(numbers[4]), INT64_FORMAT, bucket->ttl_ms);
	for (int i = 0; i < 5; i++)
		args[i] = numbers[i];
	args[5] = rl_test_clock_ms ? rl_test_clock_ms : "";
	args[6] = request->mode == BUCKET_PEEK ? "peek" :
		request->mode == BUCKET_REFUND ? "refund" : "take";
}

/*
 * Fills call with the token bucket script for request: its key (the one fixed
 * in advance, or built now), a refund's mark, the arguments and room for the
 * reply, all allocated in the current memory context.
 */
void
decision_redis_call(const DecisionRequest *request, RedisCall *call)
{
	const char **keys = palloc(2 * sizeof(char *));
	const char **args = palloc(DECISION_SCRIPT_ARGS * sizeof(char *));
	char		(*numbers)[24] = palloc(sizeof(ScriptNumbers));

	keys[0] = request->key;
	if (keys[0] == NULL)
	{
		StringInfoData key;

		initStringInfo(&key);
		subject_build_key(&key, &request->policy, request->subject, request->length);
		keys[0] = key.data;
	}
	/* A refund with an id is done once: its mark shares the bucket's hash tag. */
	if (request->refund_id != NULL)
		keys[1] = psprintf("%s:refund:%s", keys[0], request->refund_id);
	decision_script_args(request, numbers, args);

	memset(call, 0, sizeof(*call));
	call->script = &token_bucket_script;
	call->nkeys = request->refund_id != NULL ? 2 : 1;
	call->keys = keys;

	/*
	 * A take leaves the mode out: a Redis that wants a password we were not
	 * given answers NOAUTH only to at most 10 arguments (it drops an
	 * unauthenticated client that sends more), and NOAUTH is what says why.
	 */
	call->nargs = request->mode == BUCKET_TAKE ? DECISION_SCRIPT_ARGS - 1 : DECISION_SCRIPT_ARGS;
	call->args = args;
	call->nresults = 4;
	call->results = palloc(4 * sizeof(long long));
}

/* Asks Redis; true with decision filled when it answered, else failure says why. */
static bool
decide_by_redis(void *arg, RedisFailure *failure)
{
	const DecisionRequest *request = ((RedisAsk *) arg)->request;
	Decision   *decision = ((RedisAsk *) arg)->decision;
	RedisCall	call;

	decision_redis_call(request, &call);
	if (!redis_run_scripts(&call, 1, 0, failure))
		return false;
	*failure = call.failure;
	return call.answered && decision_from_reply(call.results, decision, failure);
}

/*
 * Fills decision from a script's four numbers {allowed, remaining, retry_after_ms,
 * reset_after_ms}; false, with a protocol failure, when they make no sense.
 */
bool
decision_from_reply(const long long *results, Decision *decision, RedisFailure *failure)
{
	if (results[1] < 0 || results[2] < 0 || results[3] < 0)
	{
		failure->kind = REDIS_FAILURE_PROTOCOL;
		strlcpy(failure->detail, "unexpected reply", sizeof(failure->detail));
		return false;
	}
	decision->allowed = results[0] == 1;
	decision->remaining = results[1];
	decision->retry_after_ms = results[2];
	decision->reset_after_ms = results[3];
	decision->source = DECISION_SOURCE_REDIS;
	return true;
}

/*
 * Checks the (policy, subject, cost or amount) arguments of fcinfo into
 * request for mode: raises the contract's errors for bad input.
 */
void
decision_request_init(FunctionCallInfo fcinfo, BucketMode mode, DecisionRequest *request)
{
	if (PG_NARGS() > 2 && PG_ARGISNULL(2) && !PG_ARGISNULL(0) && !PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", mode == BUCKET_REFUND ? "amount" : "cost")));
	decision_policy_subject(fcinfo, request);
	decision_request_cost(request, mode, PG_NARGS() > 2 ? PG_GETARG_INT64(2) : 1);
}

/*
 * Checks a policy name and a subject into request (the rest of it zeroed) and
 * returns the cached policy: the contract's errors for an unknown or unusable
 * policy and a bad subject. function_oid is the calling SQL function.
 */
const Policy *
decision_request_check(Oid function_oid, const char *name, const char *subject,
					   int length, DecisionRequest *request)
{
	const Policy *policy = policy_lookup(function_oid, name);

	if (policy == NULL)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("rate limit policy \"%s\" does not exist", name)));
	subject_check(subject, length);
	memset(request, 0, sizeof(*request));
	request->policy = *policy;	/* a copy: the cache may be reloaded later */
	request->subject = subject;
	request->length = length;
	policy_apply_override(&request->policy, subject, length);
	policy = &request->policy;
	if (!policy->usable)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("rate limit policy \"%s\" is outside the supported bounds", policy->name),
				 errdetail("With g = gcd(refill_amount, refill_period in ms), capacity * period_ms / g + refill_amount / g must stay below 2^53."),
				 errhint("Restore the table's constraints and correct the policy.")));
	return policy;
}

/*
 * Sets a checked request's mode and cost (a refund's amount): token buckets
 * only, except for a peek, and a cost between 1 and the capacity (a refund's
 * amount is capped at the capacity instead).
 */
void
decision_request_cost(DecisionRequest *request, BucketMode mode, int64 cost)
{
	const Policy *policy = &request->policy;
	const char *amount_name = mode == BUCKET_REFUND ? "amount" : "cost";

	if (policy->algorithm != ALGORITHM_TOKEN_BUCKET && mode != BUCKET_PEEK)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("rate limit policy \"%s\" is a concurrency policy", policy->name),
				 errhint("Take its leases with rl_acquire and give them back with rl_release.")));
	if (policy->algorithm == ALGORITHM_CONCURRENCY && cost != 1)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a peek at concurrency policy \"%s\" counts one lease", policy->name),
				 errdetail("The cost was " INT64_FORMAT ".", cost)));
	if (mode == BUCKET_REFUND && cost > policy->bucket.capacity)
		cost = policy->bucket.capacity;
	if (cost <= 0 || cost > policy->bucket.capacity)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 1 and the capacity of policy \"%s\" (" INT64_FORMAT ")",
						amount_name, policy->name, policy->bucket.capacity),
				 errdetail("The %s was " INT64_FORMAT ".", amount_name, cost)));
	request->mode = mode;
	request->cost = cost;
}

/* Checks the (policy, subject) arguments of fcinfo into request; see decision_request_check. */
const Policy *
decision_policy_subject(FunctionCallInfo fcinfo, DecisionRequest *request)
{
	text	   *subject;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(0) ? "policy" : "subject")));
	subject = PG_GETARG_TEXT_PP(1);
	return decision_request_check(fcinfo->flinfo->fn_oid, text_to_cstring(PG_GETARG_TEXT_PP(0)),
								  VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject), request);
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

/* Runs a checked request: Redis while it answers, else the policy's fail mode. */
void
decision_run(const DecisionRequest *request, Decision *decision)
{
	const Policy *policy = &request->policy;
	RedisAsk	ask = {.request = request,.decision = decision};
	RedisFailure failure;
	bool		answered;

	decision_init(policy, decision);
	/* A refund goes to the bucket whatever answers decisions. */
	if (request->mode == BUCKET_REFUND || !decision_fixed(policy, decision))
	{
		/* While the breaker is open, Redis is not asked at all. */
		answered = breaker_call(decide_by_redis, &ask, &failure);
		decision_note_redis(policy, answered, &failure);
		if (!answered)
			decide_by_fail_mode(request, decision);
	}
	if (request->mode != BUCKET_REFUND)
		decision_shadow(policy, decision);
	if (request->mode == BUCKET_TAKE)
		decision_observe(request, decision, request->cost);
}

/*
 * Counts a decision that spends (a take, a lease) in rl_stats and writes its
 * decision log line, if chosen. cost is what it asked for.
 */
void
decision_observe(const DecisionRequest *request, const Decision *decision, int64 cost)
{
	stats_decision(decision, cost);
	decision_log(decision, cost, request->subject, request->length);
}

/*
 * Forgets the request's bucket in Redis (a full bucket again): decision_reset
 * answers false when Redis could not answer; the local bucket, if any, is left
 * alone.
 */
static bool
reset_in_redis(void *arg, RedisFailure *failure)
{
	const DecisionRequest *request = arg;
	StringInfoData key;
	const char *keys[1];
	long long	deleted;
	bool		answered;

	initStringInfo(&key);
	subject_build_key(&key, &request->policy, request->subject, request->length);
	keys[0] = key.data;
	answered = redis_run_script(&reset_script, 1, keys, 0, NULL, &deleted, 1, failure);
	pfree(key.data);
	return answered;
}

bool
decision_reset(const DecisionRequest *request)
{
	RedisFailure failure;
	bool		answered = breaker_call(reset_in_redis, (void *) request, &failure);

	decision_note_redis(&request->policy, answered, &failure);
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

/* Decides the (policy, subject, cost) arguments of fcinfo in mode. */
void
decision_make(FunctionCallInfo fcinfo, BucketMode mode, Decision *decision)
{
	DecisionRequest request;

	decision_request_init(fcinfo, mode, &request);
	decision_run(&request, decision);
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

/*
 * How rl_enforce words a denial: RL503 when Redis could not answer and the
 * policy fails closed, else RL429. The detail gives the retry-after in whole
 * seconds (what an HTTP Retry-After takes). Never the subject or a key.
 */
void
decision_denial(const Decision *decision, DecisionDenial *denial)
{
	int64		seconds = decision_retry_after_seconds(decision);

	denial->unavailable = decision->source == DECISION_SOURCE_FAIL_CLOSED;
	denial->message = psprintf(denial->unavailable ? "rate limiter unavailable for policy \"%s\"" :
							   "rate limit exceeded for policy \"%s\"", decision->policy);
	denial->detail = psprintf(seconds == 1 ? "Retry after " INT64_FORMAT " second." :
							  "Retry after " INT64_FORMAT " seconds.", seconds);
	denial->hint = denial->unavailable ? pstrdup("Redis did not answer and the policy fails closed.") :
		psprintf("Wait before retrying; the limit is " INT64_FORMAT ".", decision->capacity);
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
	if (policy->mode == POLICY_MODE_SHADOW && !decision->allowed)
	{
		decision->allowed = true;
		decision->origin = decision->source;
		decision->source = DECISION_SOURCE_SHADOW;
	}
}

/*
 * Raises rl_enforce's error for a denial: RL503 when Redis could not answer
 * and the policy fails closed, RL429 for a quota denial; with
 * ratelimit.postgrest_errors, the PGRST error PostgREST answers with. Nothing
 * for a grant. function_oid is the calling SQL function.
 */
void
decision_enforce(Oid function_oid, const Decision *decision)
{
	DecisionDenial denial;

	if (decision->allowed)
		return;
	if (rl_postgrest_errors)
		headers_raise_postgrest(function_oid, decision);
	decision_denial(decision, &denial);
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(denial.unavailable ? ERRCODE_RL_UNAVAILABLE : ERRCODE_RL_RATE_LIMIT_EXCEEDED),
			 errmsg_internal("%s", denial.message),
			 errdetail_internal("%s", denial.detail),
			 errhint("%s", denial.hint)));
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
		case DECISION_SOURCE_FAIL_CLOSED:
			break;
	}
	return "fail_closed";
}

/* Builds the rl_decision composite the calling function returns. */
Datum
decision_to_datum(FunctionCallInfo fcinfo, const Decision *decision)
{
	TupleDesc	desc = (TupleDesc) fcinfo->flinfo->fn_extra;
	Datum		values[8];
	bool		nulls[8] = {0};

	/* The row type is looked up once per call site, not once per decision. */
	if (desc == NULL)
	{
		MemoryContext old_context = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("function returning rl_decision called in a context that cannot accept it")));
		desc = BlessTupleDesc(desc);
		MemoryContextSwitchTo(old_context);
		fcinfo->flinfo->fn_extra = desc;
	}
	decision_to_values(decision, values);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/* The eight rl_decision columns of decision (none of them NULL). */
void
decision_to_values(const Decision *decision, Datum *values)
{
	values[0] = BoolGetDatum(decision->allowed);
	values[1] = Int64GetDatum(decision->remaining);
	values[2] = Int64GetDatum(decision->capacity);
	values[3] = Int64GetDatum(decision->retry_after_ms);
	values[4] = Int64GetDatum(decision->reset_after_ms);
	values[5] = CStringGetTextDatum(decision->policy);
	values[6] = Int32GetDatum(decision->version);
	values[7] = CStringGetTextDatum(decision_source_name(decision->source));
}
