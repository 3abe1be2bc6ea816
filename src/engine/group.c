/*
 * multi.c
 *	  rl_consume_all: several checks (a tenant's and a user's, say) taken in one
 *	  atomic step, all granted or none charged.
 *
 * Redis runs every check in one script call, which is atomic only when every
 * key lives on one node: in Redis Cluster, in one hash slot. So the subjects of
 * one call must share a hash tag: write related subjects as "tenant/user", whose
 * tag is "tenant" (subject.c). Checks that could not be atomic there are refused.
 *
 * While Redis cannot answer, each check's fail mode decides and the group is
 * still all or nothing: any 'closed' check denies the whole group, 'local'
 * checks take from their local buckets and give back what they took if a later
 * one is short.
 */
#include "ratelimit.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "breaker.h"
#include "decision.h"
#include "log_privacy.h"
#include "subject.h"

/* The most checks in one call. */
#define MULTI_MAX_CHECKS 32

/* The checks of one call, for breaker_call. */
typedef struct MultiCall
{
	int			count;
	DecisionRequest *requests;
	Decision   *decisions;
	bool	   *fixed;			/* decided without a bucket (decision_fixed): not in Redis */
	int			asked;			/* checks that go to Redis */
} MultiCall;

/*
 * Runs every check that needs a bucket in one script call; true with their
 * decisions filled when Redis answered.
 */
static bool
multi_redis(void *arg, RedisFailure *failure)
{
	MultiCall  *call = arg;
	const char **keys = palloc(call->asked * sizeof(char *));
	const char **args = palloc(DECISION_SCRIPT_ARGS * call->asked * sizeof(char *));
	ScriptNumbers *numbers = palloc(call->asked * sizeof(ScriptNumbers));
	long long  *results = palloc(4 * call->asked * sizeof(long long));
	bool		answered;
	int			n = 0;

	for (int i = 0; i < call->count; i++)
	{
		const DecisionRequest *request = &call->requests[i];
		StringInfoData key;

		if (call->fixed[i])
			continue;
		initStringInfo(&key);
		subject_build_key(&key, &request->policy, request->subject, request->length);
		keys[n] = key.data;
		decision_script_args(request, numbers[n], &args[DECISION_SCRIPT_ARGS * n]);
		n++;
	}
	answered = redis_run_script(&token_bucket_script, n, keys, DECISION_SCRIPT_ARGS * n, args,
								results, 4 * n, failure);
	n = 0;
	for (int i = 0; answered && i < call->count; i++)
		if (!call->fixed[i])
			answered = decision_from_reply(&results[4 * n++], &call->decisions[i], failure);
	return answered;
}

/* True when Redis denied the group and every check that was short is a shadow one. */
static bool
multi_only_shadow_short(const MultiCall *call)
{
	bool		any_short = false;

	for (int i = 0; i < call->count; i++)
	{
		const Decision *decision = &call->decisions[i];

		if (call->fixed[i] || decision->allowed || decision->retry_after_ms == 0)
			continue;
		if (call->requests[i].policy.mode != POLICY_MODE_SHADOW)
			return false;
		any_short = true;
	}
	return any_short;
}

/* Decides the group by each check's fail mode, all or nothing. */
static void
multi_fail_mode(MultiCall *call)
{
	int			taken = 0;
	bool		denied = false;

	/*
	 * A 'closed' check (or a 'local' one without a usable local bucket) closes
	 * the group, unless its policy is in shadow mode. Checks decided without a
	 * bucket (disabled, an 'allow' override) never deny.
	 */
	for (int i = 0; i < call->count; i++)
	{
		const Policy *policy = &call->requests[i].policy;

		if (!call->fixed[i] && policy->fail_mode != FAIL_MODE_OPEN &&
			policy->mode == POLICY_MODE_ENFORCE && !decision_local_possible(&call->requests[i]))
			denied = true;
	}
	for (int i = 0; !denied && i < call->count; i++)
	{
		Decision   *decision = &call->decisions[i];

		if (call->fixed[i])
			continue;
		if (call->requests[i].policy.fail_mode == FAIL_MODE_OPEN)
		{
			decision->allowed = true;
			decision->source = DECISION_SOURCE_FAIL_OPEN;
			continue;
		}
		if (!decision_local_possible(&call->requests[i]))
		{
			/* A shadow or disabled check that fails closed: its mode decides later. */
			decision->allowed = false;
			decision->source = DECISION_SOURCE_FAIL_CLOSED;
			decision->retry_after_ms = breaker_retry_after_ms();
			continue;
		}
		decision_local(&call->requests[i], BUCKET_TAKE, decision);
		taken = i + 1;
		if (!decision->allowed && call->requests[i].policy.mode == POLICY_MODE_ENFORCE)
		{
			denied = true;
			break;
		}
	}
	if (!denied)
		return;

	/* Give back what local buckets took, then deny every check. */
	for (int i = 0; i < taken; i++)
	{
		Decision	refund;

		/* Only what was taken goes back: a short bucket took nothing. */
		if (call->decisions[i].source == DECISION_SOURCE_LOCAL && call->decisions[i].allowed)
		{
			decision_local(&call->requests[i], BUCKET_REFUND, &refund);
			call->decisions[i].remaining = refund.remaining;
			call->decisions[i].reset_after_ms = refund.reset_after_ms;
		}
	}
	for (int i = 0; i < call->count; i++)
	{
		Decision   *decision = &call->decisions[i];

		if (decision->source == DECISION_SOURCE_LOCAL && !decision->allowed)
			continue;			/* the short local bucket keeps its own answer */
		decision->allowed = false;
		decision->source = DECISION_SOURCE_FAIL_CLOSED;
		decision->retry_after_ms = breaker_retry_after_ms();
		decision->reset_after_ms = decision->retry_after_ms;
	}
}

/*
 * Decides the group in Redis while it answers, else by each check's fail mode.
 * A short shadow check must not stop the others: then Redis is asked again
 * without it, and its own answer is kept.
 */
static void
multi_decide(MultiCall *call)
{
	RedisFailure failure;
	bool		answered;

	if (call->asked == 0)
		return;					/* every check was decided without a bucket */
	answered = breaker_call(multi_redis, call, &failure);
	decision_note_redis(&call->requests[0].policy, answered, &failure);
	if (answered && multi_only_shadow_short(call))
	{
		Decision   *kept = palloc(call->count * sizeof(Decision));

		memcpy(kept, call->decisions, call->count * sizeof(Decision));
		for (int i = 0; i < call->count; i++)
			if (!call->fixed[i] && !kept[i].allowed && kept[i].retry_after_ms > 0)
				call->requests[i].cost = 0;
		answered = breaker_call(multi_redis, call, &failure);
		decision_note_redis(&call->requests[0].policy, answered, &failure);
		for (int i = 0; answered && i < call->count; i++)
			if (!call->fixed[i] && !kept[i].allowed && kept[i].retry_after_ms > 0)
				call->decisions[i] = kept[i];
	}
	if (!answered)
		multi_fail_mode(call);
}

/*
 * Denies the group for an enforced 'deny' override: nothing taken, nothing
 * left, and every check told to wait as long as the override (retry_ms).
 */
static void
multi_denied_by_override(MultiCall *call, int64 retry_ms)
{
	for (int i = 0; i < call->count; i++)
	{
		Decision   *decision = &call->decisions[i];

		decision->allowed = false;
		decision->remaining = 0;
		decision->retry_after_ms = retry_ms;
		decision->reset_after_ms = 0;
		decision->source = DECISION_SOURCE_OVERRIDE;
	}
}

/* The elements of a one-dimensional array argument; NULL elements are 22004. */
static int
multi_array(FunctionCallInfo fcinfo, int argno, Oid type, const char *what, Datum **values)
{
	ArrayType  *array;
	bool	   *nulls;
	int			count;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", what)));
	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	deconstruct_array(array, type, typlen, typbyval, typalign, values, &nulls, &count);
	for (int i = 0; i < count; i++)
		if (nulls[i])
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not hold nulls", what)));
	return count;
}

/*
 * rl_consume_all(policies, subjects, costs DEFAULT NULL): one decision per
 * check, all granted or none charged; NULL costs mean 1 each.
 */
RL_SQL_FUNCTION(rl_consume_all)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *policies;
	Datum	   *subjects;
	Datum	   *costs = NULL;
	MultiCall	call;
	StringInfoData first_tag;
	StringInfoData tag;
	int64		denied_for_ms;

	call.count = multi_array(fcinfo, 0, TEXTOID, "policies", &policies);
	if (multi_array(fcinfo, 1, TEXTOID, "subjects", &subjects) != call.count ||
		(!PG_ARGISNULL(2) && multi_array(fcinfo, 2, INT8OID, "costs", &costs) != call.count))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("policies, subjects and costs must have the same number of elements")));
	if (call.count < 1 || call.count > MULTI_MAX_CHECKS)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rl_consume_all takes 1 to %d checks", MULTI_MAX_CHECKS)));

	call.requests = palloc0(call.count * sizeof(DecisionRequest));
	call.decisions = palloc0(call.count * sizeof(Decision));
	call.fixed = palloc0(call.count * sizeof(bool));
	call.asked = 0;
	initStringInfo(&first_tag);
	initStringInfo(&tag);
	for (int i = 0; i < call.count; i++)
	{
		text	   *subject = DatumGetTextPP(subjects[i]);
		DecisionRequest *request = &call.requests[i];
		Decision   *decision = &call.decisions[i];

		decision_request_check(fcinfo->flinfo->fn_oid, TextDatumGetCString(policies[i]),
							   VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject), request);
		decision_request_cost(request, BUCKET_TAKE, costs ? DatumGetInt64(costs[i]) : 1);

		/* One atomic script needs one Redis Cluster slot: one hash tag. */
		resetStringInfo(&tag);
		subject_hash_tag(&tag, request->subject, request->length);
		if (i == 0)
			appendStringInfoString(&first_tag, tag.data);
		else if (strcmp(tag.data, first_tag.data) != 0)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the checks of rl_consume_all must share one hash tag"),
					 errdetail("Check %d has another hash tag than check 1, so no single Redis node could take them atomically.",
							   i + 1),
					 errhint("Write related subjects as 'tenant/user': the part before the '/' is the hash tag.")));

		decision_init(&request->policy, decision);
	}

	/* Checked before anything is charged: a context that takes no set fails here. */
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	/*
	 * A check decided without a bucket (disabled policy, 'allow' or 'deny'
	 * override) is not sent to Redis. An enforced 'deny' denies the whole
	 * group without asking Redis: every check then waits as long as it.
	 */
	denied_for_ms = -1;
	for (int i = 0; i < call.count; i++)
	{
		const Policy *policy = &call.requests[i].policy;

		call.fixed[i] = decision_fixed(policy, &call.decisions[i]);
		if (!call.fixed[i])
			call.asked++;
		else if (!call.decisions[i].allowed && policy->mode == POLICY_MODE_ENFORCE)
			denied_for_ms = Max(denied_for_ms, call.decisions[i].retry_after_ms);
	}
	if (denied_for_ms >= 0)
		multi_denied_by_override(&call, denied_for_ms);
	else
		multi_decide(&call);
	for (int i = 0; i < call.count; i++)
	{
		Decision   *decision = &call.decisions[i];

		/* Fixed answers stand (a failing group may have denied them too); shadow lets a denial through. */
		if (call.fixed[i])
			(void) decision_fixed(&call.requests[i].policy, decision);
		decision_shadow(&call.requests[i].policy, decision);
		decision_observe(&call.requests[i], decision, costs ? DatumGetInt64(costs[i]) : 1);
	}

	for (int i = 0; i < call.count; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {0};

		decision_to_values(&call.decisions[i], values);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
