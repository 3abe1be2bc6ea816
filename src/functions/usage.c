/*
 * usage.c
 *	  rl_usage: how much of its limit each subject of a policy has used, read
 *	  from Redis by the policy's peek, for many subjects in one round trip per
 *	  Redis node (a report over all tenants); nothing is taken.
 */
#include "prelude.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "base/clock.h"
#include "base/log_privacy.h"
#include "engine/decide.h"
#include "engine/lease.h"
#include "functions/args.h"
#include "policy/placement.h"

/* True when decision's remaining is what Redis holds (so usage can be read off it). */
static bool
usage_known(const Decision *decision)
{
	DecisionSource source = decision->source == DECISION_SOURCE_SHADOW ?
		decision->origin : decision->source;

	return source == DECISION_SOURCE_REDIS;
}

/*
 * Fills the row of one subject: used, limit, fraction and reset from its
 * peek (decided at now_ms), and its source; the numbers NULL when Redis did
 * not answer (a fail mode's remaining says nothing of what was used).
 */
static void
usage_row(const DecisionRequest *request, const Decision *decision, Datum subject, int64 now_ms,
		  ArgsRow *row)
{
	args_row_set(row, "subject", TEXTOID, subject);
	args_row_set(row, "source", TEXTOID,
				 CStringGetTextDatum(decision_source_name(decision->source)));
	if (!usage_known(decision))
		return;
	{
		/* A split policy's peek reads this region's share of the window (engine/region.c). */
		int64		limit = request->policy.region_mode == REGION_MODE_SPLIT ?
			placement_share(&request->policy) : decision->capacity;
		int64		used = Max(limit - decision->remaining, 0);
		TimestampTz reset = clock_timestamp_of_ms(now_ms + decision->reset_after_ms);

		args_row_set(row, "used", INT8OID, Int64GetDatum(used));
		args_row_set(row, "limit", INT8OID, Int64GetDatum(limit));
		args_row_set(row, "fraction", FLOAT8OID,
					 Float8GetDatum(limit > 0 ? (double) used / (double) limit : 1.0));
		args_row_set(row, "reset", TIMESTAMPTZOID, TimestampTzGetDatum(reset));
	}
}

/*
 * The rows of subjects[0 .. count) of policy (argument 0 of fcinfo): a row
 * per subject, in input order: the subject (the array form), used, limit (a
 * fixed window's with what it carried over), the fraction used, when it is
 * full again, and who answered. Every subject is checked (the contract's
 * errors) before anything is sent.
 */
static Datum
usage_rows(FunctionCallInfo fcinfo, Datum *subjects, int count)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	DecisionRequest *requests;
	Decision   *decisions;
	char	   *policy;
	int64		now_ms;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("policy must not be null"),
				 errhint("Pass a policy name from rl_policy.")));
	policy = TextDatumGetCString(PG_GETARG_DATUM(0));
	if (count > BATCH_MAX_DECISIONS)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rl_usage takes at most %d subjects", BATCH_MAX_DECISIONS),
				 errdetail("It was given %d.", count),
				 errhint("Split the subjects into several calls.")));
	requests = palloc0(Max(count, 1) * sizeof(DecisionRequest));
	decisions = palloc0(Max(count, 1) * sizeof(Decision));
	for (int i = 0; i < count; i++)
	{
		text	   *subject = DatumGetTextPP(subjects[i]);

		request_check(fcinfo->flinfo->fn_oid, policy, VARDATA_ANY(subject),
					  VARSIZE_ANY_EXHDR(subject), &requests[i]);
		request_cost(&requests[i], LIMIT_PEEK, 1);
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	now_ms = clock_now_ms();
	if (count > 0 && requests[0].policy.algorithm == ALGORITHM_CONCURRENCY)
		lease_peek_many(requests, decisions, count);
	else
		batch_run(requests, decisions, count);
	for (int i = 0; i < count; i++)
		decision_raise_script_error(&decisions[i]);
	for (int i = 0; i < count; i++)
	{
		ArgsRow		row;

		args_row_start(&row, rsinfo->setDesc);
		usage_row(&requests[i], &decisions[i], subjects[i], now_ms, &row);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row.values, row.nulls);
	}
	return (Datum) 0;
}

/* rl_usage(policy, subjects): the usage of many subjects of one policy. */
RL_SQL_FUNCTION(rl_usage)
{
	Datum	   *subjects;
	int			count = args_array(fcinfo, 1, TEXTOID, "subjects", &subjects);

	return usage_rows(fcinfo, subjects, count);
}

/* rl_usage(policy, subject): the usage of one subject. */
RL_SQL_FUNCTION(rl_usage_one)
{
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("subject must not be null"),
				 errhint("Pass the subject whose usage to read.")));
	return usage_rows(fcinfo, &fcinfo->args[1].value, 1);
}
