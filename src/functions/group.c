/*
 * group.c
 *	  rl_consume_all: several checks (a tenant's and a user's, say) taken in
 *	  one atomic step, all granted or none charged (engine/group.c).
 */
#include "prelude.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "base/log_privacy.h"
#include "engine/group.h"
#include "functions/args.h"

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
	DecisionRequest *requests;
	Decision   *decisions;
	int			count;

	count = args_array(fcinfo, 0, TEXTOID, "policies", &policies);
	if (args_array(fcinfo, 1, TEXTOID, "subjects", &subjects) != count ||
		(!PG_ARGISNULL(2) && args_array(fcinfo, 2, INT8OID, "costs", &costs) != count))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("policies, subjects and costs must have the same number of elements"),
				 errhint("Give one policy, one subject and one cost per check, in the same order.")));
	if (count < 1 || count > GROUP_MAX_CHECKS)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rl_consume_all takes 1 to %d checks", GROUP_MAX_CHECKS),
				 errhint("Split the checks into several calls, or combine policies.")));

	requests = palloc0(count * sizeof(DecisionRequest));
	decisions = palloc0(count * sizeof(Decision));
	for (int i = 0; i < count; i++)
	{
		text	   *subject = DatumGetTextPP(subjects[i]);

		request_check(fcinfo->flinfo->fn_oid, TextDatumGetCString(policies[i]),
					  VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject), &requests[i]);
		request_cost(&requests[i], LIMIT_TAKE, costs ? DatumGetInt64(costs[i]) : 1);
		group_check(requests, i);
	}
	/* Since 0.10: request_id, carried by the first check (engine/group.c). */
	if (PG_NARGS() > 3 && !PG_ARGISNULL(3))
	{
		text	   *id = PG_GETARG_TEXT_PP(3);

		request_once(&requests[0], VARDATA_ANY(id), VARSIZE_ANY_EXHDR(id));
	}

	/* Checked before anything is charged: a context that takes no set fails here. */
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	group_run(requests, decisions, count);
	for (int i = 0; i < count; i++)
	{
		Datum		values[ARGS_DECISION_COLUMNS + 1];
		bool		nulls[ARGS_DECISION_COLUMNS + 1];

		args_decision_values(&decisions[i], rsinfo->setDesc, 0, values, nulls);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
