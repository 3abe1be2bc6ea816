/*
 * args.c
 *	  SQL arguments in, SQL values out: a (policy, subject, cost) call checked
 *	  into a DecisionRequest, array arguments, and a Decision as an rl_decision.
 *
 * NULL arguments are refused with 22004 here, naming the argument: a NULL
 * result could be read as "allowed".
 */
#include "prelude.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "functions/args.h"

/*
 * Checks the (policy, subject, cost or amount) arguments of fcinfo into
 * request for mode: raises the contract's errors for bad input.
 */
void
args_request(FunctionCallInfo fcinfo, LimitMode mode, DecisionRequest *request)
{
	if (PG_NARGS() > 2 && PG_ARGISNULL(2) && !PG_ARGISNULL(0) && !PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", mode == LIMIT_REFUND ? "amount" : "cost"),
				 errhint("Pass a whole number of tokens, or omit it for 1.")));
	args_policy_subject(fcinfo, request);
	request_cost(request, mode, PG_NARGS() > 2 ? PG_GETARG_INT64(2) : 1);
	if (mode == LIMIT_TAKE)
		args_take_options(fcinfo, 3, request);
}

/*
 * Reads a take's options from argument first on, where the function has them
 * (since 0.10): max_wait interval (NULL: no wait), then request_id text (NULL:
 * none).
 */
void
args_take_options(FunctionCallInfo fcinfo, int first, DecisionRequest *request)
{
	if (PG_NARGS() > first && !PG_ARGISNULL(first))
		request_wait(request, PG_GETARG_INTERVAL_P(first));
	if (PG_NARGS() > first + 1 && !PG_ARGISNULL(first + 1))
	{
		text	   *id = PG_GETARG_TEXT_PP(first + 1);

		request_once(request, VARDATA_ANY(id), VARSIZE_ANY_EXHDR(id));
	}
}

/* Checks the (policy, subject) arguments of fcinfo into request; see request_check. */
const Policy *
args_policy_subject(FunctionCallInfo fcinfo, DecisionRequest *request)
{
	text	   *subject;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(0) ? "policy" : "subject"),
				 errhint("Pass a policy name from rl_policy and a non-empty subject (coalesce a NULL subject to a value of your choice).")));
	subject = PG_GETARG_TEXT_PP(1);
	return request_check(fcinfo->flinfo->fn_oid, text_to_cstring(PG_GETARG_TEXT_PP(0)),
						 VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject), request);
}

/* The elements of a one-dimensional array argument; NULL elements are 22004. */
int
args_array(FunctionCallInfo fcinfo, int argno, Oid type, const char *what, Datum **values)
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
				 errmsg("%s must not be null", what),
				 errhint("Pass an array, empty if there is nothing to decide.")));
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", what),
				 errhint("Pass a flat array, as in ARRAY['a', 'b'].")));
	get_typlenbyvalalign(type, &typlen, &typbyval, &typalign);
	deconstruct_array(array, type, typlen, typbyval, typalign, values, &nulls, &count);
	for (int i = 0; i < count; i++)
		if (nulls[i])
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not hold nulls", what),
					 errhint("Remove the NULL elements, or replace them with values (array_remove(a, NULL)).")));
	return count;
}

/* Starts row for a tuple of desc, every column NULL. */
void
args_row_start(ArgsRow *row, TupleDesc desc)
{
	row->desc = desc;
	row->values = palloc0(Max(desc->natts, 1) * sizeof(Datum));
	row->nulls = palloc(Max(desc->natts, 1) * sizeof(bool));
	memset(row->nulls, true, Max(desc->natts, 1) * sizeof(bool));
}

/*
 * Sets the column named column of row, if the row type has it (an older
 * version's may not): its type must be type, or the SQL objects are not
 * those this library knows.
 */
void
args_row_set(ArgsRow *row, const char *column, Oid type, Datum value)
{
	for (int i = 0; i < row->desc->natts; i++)
	{
		Form_pg_attribute attribute = TupleDescAttr(row->desc, i);

		if (attribute->attisdropped || strcmp(NameStr(attribute->attname), column) != 0)
			continue;
		if (attribute->atttypid != type)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("column \"%s\" has type %s, the ratelimit library returns %s",
							column, format_type_be(attribute->atttypid), format_type_be(type)),
					 errhint("Run ALTER EXTENSION ratelimit UPDATE.")));
		row->values[i] = value;
		row->nulls[i] = false;
		return;
	}
}

/*
 * The rl_decision columns of decision (none of them NULL) into values and
 * nulls from column first of desc on: eight, then waited_ms where desc has it
 * (0.10 on; an older version's row type has not).
 */
void
args_decision_values(const Decision *decision, TupleDesc desc, int first, Datum *values,
					 bool *nulls)
{
	if (desc->natts < first + ARGS_DECISION_COLUMNS || desc->natts > first + ARGS_DECISION_COLUMNS + 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("rl_decision has %d columns, the ratelimit library returns %d",
						desc->natts - first, ARGS_DECISION_COLUMNS + 1),
				 errhint("Run ALTER EXTENSION ratelimit UPDATE.")));
	memset(&nulls[first], false, (desc->natts - first) * sizeof(bool));
	if (desc->natts > first + ARGS_DECISION_COLUMNS)
	{
		Form_pg_attribute waited = TupleDescAttr(desc, first + ARGS_DECISION_COLUMNS);

		values[first + ARGS_DECISION_COLUMNS] = Int64GetDatum(decision->waited_ms);
		if (strcmp(NameStr(waited->attname), "waited_ms") != 0 || waited->atttypid != INT8OID)
			nulls[first + ARGS_DECISION_COLUMNS] = true;
	}
	values += first;
	values[0] = BoolGetDatum(decision->allowed);
	values[1] = Int64GetDatum(decision->remaining);
	values[2] = Int64GetDatum(decision->capacity);
	values[3] = Int64GetDatum(decision->retry_after_ms);
	values[4] = Int64GetDatum(decision->reset_after_ms);
	values[5] = CStringGetTextDatum(decision->policy);
	values[6] = Int32GetDatum(decision->version);
	values[7] = CStringGetTextDatum(decision_source_name(decision->source));
}

/* Builds the rl_decision composite the calling function returns. */
Datum
args_decision_datum(FunctionCallInfo fcinfo, const Decision *decision)
{
	TupleDesc	desc = (TupleDesc) fcinfo->flinfo->fn_extra;
	Datum		values[ARGS_DECISION_COLUMNS + 1];
	bool		nulls[ARGS_DECISION_COLUMNS + 1];

	/* The row type is looked up once per call site, not once per decision. */
	if (desc == NULL)
	{
		MemoryContext old_context = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("function returning rl_decision called in a context that cannot accept it"),
					 errhint("Call it in a FROM clause or a select list, as in SELECT * FROM rl_consume(...).")));
		desc = BlessTupleDesc(desc);
		MemoryContextSwitchTo(old_context);
		fcinfo->flinfo->fn_extra = desc;
	}
	args_decision_values(decision, desc, 0, values, nulls);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}
