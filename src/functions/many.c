/*
 * many.c
 *	  rl_consume_many: one policy, many subjects, an independent decision for
 *	  each in one round trip per Redis node (engine/decide.c).
 */
#include "prelude.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "base/log_privacy.h"
#include "engine/decide.h"
#include "functions/args.h"

/*
 * rl_consume_many(policy, subjects, costs DEFAULT NULL): a row per subject,
 * in input order: the subject, then rl_decision's fields. Every element is
 * checked (the contract's errors, as rl_consume's) before anything is sent.
 */
RL_SQL_FUNCTION(rl_consume_many)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *subjects;
	Datum	   *costs = NULL;
	Datum	   *ids = NULL;
	DecisionRequest *requests;
	Decision   *decisions;
	char	   *policy;
	int			count;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("policy must not be null"),
				 errhint("Pass a policy name from rl_policy.")));
	policy = TextDatumGetCString(PG_GETARG_DATUM(0));
	count = args_array(fcinfo, 1, TEXTOID, "subjects", &subjects);
	if (!PG_ARGISNULL(2) && args_array(fcinfo, 2, INT8OID, "costs", &costs) != count)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("subjects and costs must have the same number of elements"),
				 errhint("Give one cost per subject, in the same order, or omit costs for 1 each.")));
	/* Since 0.10: request_ids, one per subject (see args_take_options). */
	if (PG_NARGS() > 3 && !PG_ARGISNULL(3) &&
		args_array(fcinfo, 3, TEXTOID, "request_ids", &ids) != count)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("subjects and request_ids must have the same number of elements"),
				 errhint("Give one request id per subject, in the same order, or omit request_ids.")));
	if (count > BATCH_MAX_DECISIONS)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rl_consume_many takes at most %d subjects", BATCH_MAX_DECISIONS),
				 errdetail("It was given %d.", count),
				 errhint("Split the subjects into several calls.")));

	requests = palloc0(Max(count, 1) * sizeof(DecisionRequest));
	decisions = palloc0(Max(count, 1) * sizeof(Decision));
	for (int i = 0; i < count; i++)
	{
		text	   *subject = DatumGetTextPP(subjects[i]);

		request_check(fcinfo->flinfo->fn_oid, policy, VARDATA_ANY(subject),
					  VARSIZE_ANY_EXHDR(subject), &requests[i]);
		request_cost(&requests[i], LIMIT_TAKE, costs ? DatumGetInt64(costs[i]) : 1);
		if (ids != NULL)
		{
			text	   *id = DatumGetTextPP(ids[i]);

			request_once(&requests[i], VARDATA_ANY(id), VARSIZE_ANY_EXHDR(id));
		}
	}

	/* Checked before anything is charged: a context that takes no set fails here. */
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	batch_run(requests, decisions, count);
	for (int i = 0; i < count; i++)
		decision_raise_script_error(&decisions[i]);
	for (int i = 0; i < count; i++)
	{
		Datum		values[ARGS_DECISION_COLUMNS + 2];
		bool		nulls[ARGS_DECISION_COLUMNS + 2];

		values[0] = subjects[i];
		nulls[0] = false;
		args_decision_values(&decisions[i], rsinfo->setDesc, 1, values, nulls);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
