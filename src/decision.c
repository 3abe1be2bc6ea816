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
#include "local.h"
#include "policy.h"
#include "redis.h"
#include "scripts.h"
#include "subject.h"

static RedisScript token_bucket_script = {
	.name = "token_bucket",
	.body = script_token_bucket,
};

/* The Redis health this backend last logged, so a failure is logged once per change. */
static RedisFailure logged_failure;

/*
 * Logs a change of Redis health: a new failure class, or recovery. Never a key
 * or subject: the statement (which may hold the subject) is kept out of the line.
 */
static void
log_redis_health(const Policy *policy, const RedisFailure *failure)
{
	if (failure->kind == logged_failure.kind &&
		strcmp(failure->detail, logged_failure.detail) == 0)
		return;
	if (failure->kind == REDIS_FAILURE_NONE)
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis answers again"),
				 errdetail("Policy \"%s\" was decided by Redis.", policy->name)));
	else
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis cannot answer (%s: %s)",
						redis_failure_kind_name(failure->kind), failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" until Redis answers.",
						   policy->name, policy_fail_mode_name(policy->fail_mode))));
	logged_failure = *failure;
}

/* Now in ms since the epoch: the test clock when set, else this server's clock. */
static int64
decision_now_ms(void)
{
	if (rl_test_clock_ms != NULL && rl_test_clock_ms[0] != '\0')
		return strtoi64(rl_test_clock_ms, NULL, 10);
	return GetCurrentTimestamp() / 1000 +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/* The local bucket's key: database, policy, version and subject, hashed (never 0). */
static uint64
local_key(const Policy *policy, const char *subject, int length)
{
	uint64		seed = hash_bytes_extended((const unsigned char *) policy->name,
										   strlen(policy->name),
										   ((uint64) MyDatabaseId << 32) | (uint32) policy->version);
	uint64		key = hash_bytes_extended((const unsigned char *) subject, length, seed);

	return key != 0 ? key : 1;
}

/* Fills decision from the policy's fail mode, for when Redis could not decide. */
static void
decide_by_fail_mode(const Policy *policy, const char *subject, int length,
					int64 cost, Decision *decision)
{
	if (policy->fail_mode == FAIL_MODE_OPEN)
	{
		decision->allowed = true;
		decision->source = DECISION_SOURCE_FAIL_OPEN;
		return;
	}
	if (policy->fail_mode == FAIL_MODE_LOCAL && local_available() &&
		policy->local_usable && cost <= policy->local_bucket.capacity)
	{
		BucketResult result;

		local_take(&policy->local_bucket, local_key(policy, subject, length),
				   decision_now_ms(), cost, &result);
		decision->allowed = result.allowed;
		decision->remaining = result.remaining;
		decision->retry_after_ms = result.retry_after_ms;
		decision->reset_after_ms = result.reset_after_ms;
		decision->source = DECISION_SOURCE_LOCAL;
		return;
	}
	/* 'closed', and 'local' where no local bucket can decide (no preload, cost too high). */
	decision->allowed = false;
	decision->retry_after_ms = breaker_retry_after_ms();
	decision->reset_after_ms = decision->retry_after_ms;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
}

/* Asks Redis; true with decision filled when it answered, else failure says why. */
static bool
decide_by_redis(const Policy *policy, const char *subject, int length, int64 cost,
				Decision *decision, RedisFailure *failure)
{
	StringInfoData key;
	char		numbers[6][24];
	const char *args[6];
	long long	results[4];
	bool		answered;

	initStringInfo(&key);
	subject_build_key(&key, policy, subject, length);
	snprintf(numbers[0], sizeof(numbers[0]), INT64_FORMAT, policy->bucket.capacity_units);
	snprintf(numbers[1], sizeof(numbers[1]), INT64_FORMAT, policy->bucket.rate);
	snprintf(numbers[2], sizeof(numbers[2]), INT64_FORMAT, policy->bucket.unit);
	snprintf(numbers[3], sizeof(numbers[3]), INT64_FORMAT, cost);
	snprintf(numbers[4], sizeof(numbers[4]), INT64_FORMAT, policy->bucket.ttl_ms);
	strlcpy(numbers[5], rl_test_clock_ms ? rl_test_clock_ms : "", sizeof(numbers[5]));
	for (int i = 0; i < 6; i++)
		args[i] = numbers[i];

	answered = redis_run_script(&token_bucket_script, key.data, 6, args, results, 4, failure);
	pfree(key.data);
	if (answered && (results[1] < 0 || results[2] < 0 || results[3] < 0))
	{
		failure->kind = REDIS_FAILURE_PROTOCOL;
		strlcpy(failure->detail, "unexpected reply", sizeof(failure->detail));
		answered = false;
	}
	if (answered)
	{
		decision->allowed = results[0] == 1;
		decision->remaining = results[1];
		decision->retry_after_ms = results[2];
		decision->reset_after_ms = results[3];
		decision->source = DECISION_SOURCE_REDIS;
	}
	return answered;
}

/*
 * Makes the decision for the (policy, subject, cost) arguments of fcinfo:
 * raises the contract's errors for bad input, otherwise always decides.
 */
void
decision_make(FunctionCallInfo fcinfo, Decision *decision)
{
	text	   *policy_name;
	text	   *subject_text;
	const char *subject;
	int			length;
	int64		cost;
	char	   *name;
	const Policy *policy;
	BreakerAttempt attempt;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null",
						PG_ARGISNULL(0) ? "policy" : PG_ARGISNULL(1) ? "subject" : "cost")));
	policy_name = PG_GETARG_TEXT_PP(0);
	subject_text = PG_GETARG_TEXT_PP(1);
	subject = VARDATA_ANY(subject_text);
	length = VARSIZE_ANY_EXHDR(subject_text);
	cost = PG_GETARG_INT64(2);

	name = text_to_cstring(policy_name);
	policy = policy_lookup(fcinfo->flinfo->fn_oid, name);
	if (policy == NULL)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("rate limit policy \"%s\" does not exist", name)));
	pfree(name);
	if (!policy->usable)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("rate limit policy \"%s\" is outside the supported bounds", policy->name),
				 errdetail("With g = gcd(refill_amount, refill_period in ms), capacity * period_ms / g + refill_amount / g must stay below 2^53."),
				 errhint("Restore the table's constraints and correct the policy.")));
	if (cost <= 0 || cost > policy->bucket.capacity)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cost must be between 1 and the capacity of policy \"%s\" (" INT64_FORMAT ")",
						policy->name, policy->bucket.capacity),
				 errdetail("The cost was " INT64_FORMAT ".", cost)));
	subject_check(subject, length);

	memset(decision, 0, sizeof(*decision));
	strlcpy(decision->policy, policy->name, sizeof(decision->policy));
	decision->version = policy->version;
	decision->capacity = policy->bucket.capacity;

	/* While the breaker is open, Redis is not asked at all. */
	attempt = breaker_allows_attempt();
	if (attempt != BREAKER_SKIP)
	{
		RedisFailure failure;
		bool		answered;

		if (attempt == BREAKER_PROBE)
		{
			/* A probe cut short by a cancel must not keep Redis skipped for its deadline. */
			PG_TRY();
			{
				answered = decide_by_redis(policy, subject, length, cost, decision, &failure);
			}
			PG_CATCH();
			{
				breaker_release_probe();
				PG_RE_THROW();
			}
			PG_END_TRY();
		}
		else
			answered = decide_by_redis(policy, subject, length, cost, decision, &failure);
		breaker_record(&failure);
		log_redis_health(policy, &failure);
		if (answered)
			return;
	}
	decide_by_fail_mode(policy, subject, length, cost, decision);
}

/* The source column's text. */
static const char *
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
	values[0] = BoolGetDatum(decision->allowed);
	values[1] = Int64GetDatum(decision->remaining);
	values[2] = Int64GetDatum(decision->capacity);
	values[3] = Int64GetDatum(decision->retry_after_ms);
	values[4] = Int64GetDatum(decision->reset_after_ms);
	values[5] = CStringGetTextDatum(decision->policy);
	values[6] = Int32GetDatum(decision->version);
	values[7] = CStringGetTextDatum(decision_source_name(decision->source));
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}
