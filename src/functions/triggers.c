/*
 * triggers.c
 *	  The extension's trigger functions: rl_limit_trigger, which charges a
 *	  policy for the rows written, and the triggers of its own tables
 *	  (rl_policy_invalidate, rl_history_restored).
 *
 * rl_limit_trigger:
 *
 *   CREATE TRIGGER ... BEFORE INSERT ... FOR EACH ROW
 *     EXECUTE FUNCTION rl_limit_trigger('comments.create', 'tenant_id' [, 'cost_column']);
 * charges each row's subject (the column's value as text) one token, or the
 * cost column's value, and raises rl_enforce's error when denied. As a
 * statement-level AFTER trigger with REFERENCING NEW TABLE, it charges a bulk
 * INSERT or COPY once per subject, with the sum of its rows, every subject in
 * one round trip per Redis node. Charges are reservations: if the statement
 * or transaction fails, they are given back.
 */
#include "prelude.h"

#include "access/htup_details.h"
#include "common/int.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/tuplestore.h"

#include "base/log_privacy.h"
#include "engine/decide.h"
#include "engine/reservation.h"
#include "functions/enforce.h"
#include "policy/cache.h"

/* One subject's total in a statement-level charge. */
typedef struct SubjectTotal
{
	char		subject[RL_SUBJECT_MAX_BYTES + 1];	/* hash key */
	int64		cost;
} SubjectTotal;

/* The trigger's arguments: the policy and where subject and cost are in a row. */
typedef struct TriggerArgs
{
	const char *policy;
	const char *subject_column;
	int			subject_attnum;
	const char *cost_column;	/* NULL: one token a row */
	int			cost_attnum;
} TriggerArgs;

/* The column number of column in desc, or 42703. */
static int
column_attnum(TupleDesc desc, const char *column)
{
	int			attnum = SPI_fnumber(desc, column);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("rl_limit_trigger: column \"%s\" does not exist", column),
				 errhint("Name a column of the table the trigger is on.")));
	return attnum;
}

/* A row's subject: its subject column as text (palloc'd). */
static char *
row_subject(HeapTuple tuple, TupleDesc desc, const TriggerArgs *args)
{
	bool		isnull;
	Datum		value = heap_getattr(tuple, args->subject_attnum, desc, &isnull);
	Oid			output;
	bool		varlena;

	if (isnull)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("rl_limit_trigger: subject column \"%s\" is null", args->subject_column),
				 errhint("Give the column a NOT NULL constraint or a default, or name another column.")));
	getTypeOutputInfo(TupleDescAttr(desc, args->subject_attnum - 1)->atttypid, &output, &varlena);
	return OidOutputFunctionCall(output, value);
}

/* A row's cost: its cost column (an integer), or 1. */
static int64
row_cost(HeapTuple tuple, TupleDesc desc, const TriggerArgs *args)
{
	bool		isnull;
	Datum		value;

	if (args->cost_column == NULL)
		return 1;
	value = heap_getattr(tuple, args->cost_attnum, desc, &isnull);
	if (isnull)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("rl_limit_trigger: cost column \"%s\" is null", args->cost_column),
				 errhint("Give the column a NOT NULL constraint or a default, or name another column.")));
	switch (TupleDescAttr(desc, args->cost_attnum - 1)->atttypid)
	{
		case INT2OID:
			return DatumGetInt16(value);
		case INT4OID:
			return DatumGetInt32(value);
		case INT8OID:
			return DatumGetInt64(value);
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("rl_limit_trigger: cost column \"%s\" must be smallint, integer or bigint",
					args->cost_column),
			 errhint("Name an integer column, or cast in a generated column.")));
	return 0;					/* keep the compiler quiet */
}

/*
 * Checks a charge of subject cost tokens into request: the contract's errors,
 * and the error a denial would raise for a cost over the capacity.
 */
static void
charge_check(FunctionCallInfo fcinfo, const TriggerArgs *args, const char *subject, int64 cost,
			 DecisionRequest *request)
{
	request_check(fcinfo->flinfo->fn_oid, args->policy, subject, strlen(subject), request);
	/* An 'allow' or 'deny' subject, or a disabled policy, counts nothing: no bucket is asked. */
	if (decision_needs_no_bucket(&request->policy))
		cost = Min(cost, request->policy.bucket.capacity);
	if (cost > policy_most_cost(&request->policy))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_RL_RATE_LIMIT_EXCEEDED),
				 errmsg("rate limit exceeded for policy \"%s\"", request->policy.name),
				 errdetail("The write needs " INT64_FORMAT " tokens for one subject; the policy holds at most " INT64_FORMAT ".",
						   cost, policy_most_cost(&request->policy)),
				 errhint("Write fewer rows for one subject in one statement, or raise the policy's capacity.")));
	request_cost(request, LIMIT_TAKE, cost);
}

/* Charges subject cost tokens of the policy as a reservation; raises when denied. */
static void
charge_subject(FunctionCallInfo fcinfo, const TriggerArgs *args, const char *subject, int64 cost)
{
	DecisionRequest request;
	Decision	decision;

	charge_check(fcinfo, args, subject, cost, &request);
	reservation_take(&request, &decision);
	enforce(fcinfo->flinfo->fn_oid, &decision);
}

/* Statement level: one charge per subject, for the sum of its rows in the new rows. */
static void
charge_statement(FunctionCallInfo fcinfo, TriggerData *trigdata, const TriggerArgs *args)
{
	Tuplestorestate *rows = trigdata->tg_newtable;
	TupleDesc	desc = RelationGetDescr(trigdata->tg_relation);
	TupleTableSlot *slot;
	HASHCTL		hashctl = {0};
	HTAB	   *totals;
	HASH_SEQ_STATUS scan;
	SubjectTotal *total;
	DecisionRequest *requests;
	Decision   *decisions;
	long		count;
	int			n = 0;

	if (rows == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("a statement-level rl_limit_trigger needs the new rows"),
				 errhint("Declare it AFTER INSERT ... REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT.")));
	hashctl.keysize = sizeof(total->subject);
	hashctl.entrysize = sizeof(SubjectTotal);
	hashctl.hcxt = CurrentMemoryContext;
	totals = hash_create("rl_limit_trigger subjects", 64, &hashctl,
						 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	tuplestore_rescan(rows);
	while (tuplestore_gettupleslot(rows, true, false, slot))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		char	   *subject = row_subject(tuple, desc, args);
		int64		cost = row_cost(tuple, desc, args);
		bool		found;

		if (strlen(subject) > RL_SUBJECT_MAX_BYTES || cost <= 0)
			charge_subject(fcinfo, args, subject, cost);	/* raises the usual error */
		total = hash_search(totals, subject, HASH_ENTER, &found);
		if (!found)
			total->cost = 0;
		if (pg_add_s64_overflow(total->cost, cost, &total->cost))
			total->cost = PG_INT64_MAX;
		if (should_free)
			heap_freetuple(tuple);
		pfree(subject);
	}
	ExecDropSingleTupleTableSlot(slot);

	/*
	 * Every subject's charge in one round trip per node; the first denial
	 * raises, and the rollback gives back what the others took.
	 */
	count = hash_get_num_entries(totals);
	requests = palloc(Max(count, 1) * sizeof(DecisionRequest));
	decisions = palloc(Max(count, 1) * sizeof(Decision));
	hash_seq_init(&scan, totals);
	while ((total = hash_seq_search(&scan)) != NULL)
		charge_check(fcinfo, args, total->subject, total->cost, &requests[n++]);
	reservation_take_many(requests, decisions, n);
	for (int i = 0; i < n; i++)
		enforce(fcinfo->flinfo->fn_oid, &decisions[i]);
	hash_destroy(totals);
}

/* rl_limit_trigger(policy, subject_column [, cost_column]): see the file header. */
RL_SQL_FUNCTION(rl_limit_trigger)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Trigger    *trigger;
	TupleDesc	desc;
	TriggerArgs args = {0};
	HeapTuple	tuple;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rl_limit_trigger must be called as a trigger"),
				 errhint("Use it in CREATE TRIGGER ... EXECUTE FUNCTION rl_limit_trigger(policy, subject_column).")));
	trigger = trigdata->tg_trigger;
	if (trigger->tgnargs < 2 || trigger->tgnargs > 3)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rl_limit_trigger takes a policy, a subject column and an optional cost column"),
				 errhint("As in EXECUTE FUNCTION rl_limit_trigger('comments.create', 'tenant_id'), a cost column third.")));
	desc = RelationGetDescr(trigdata->tg_relation);
	args.policy = trigger->tgargs[0];
	args.subject_column = trigger->tgargs[1];
	args.subject_attnum = column_attnum(desc, args.subject_column);
	if (trigger->tgnargs == 3)
	{
		args.cost_column = trigger->tgargs[2];
		args.cost_attnum = column_attnum(desc, args.cost_column);
	}

	if (!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event))
	{
		charge_statement(fcinfo, trigdata, &args);
		return PointerGetDatum(NULL);
	}
	if (TRIGGER_FIRED_INSTEAD(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rl_limit_trigger cannot be an INSTEAD OF trigger"),
				 errhint("Use BEFORE or AFTER.")));
	if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rl_limit_trigger charges rows written: use it ON INSERT or UPDATE"),
				 errhint("Create the trigger ON INSERT or UPDATE (FOR EACH ROW, or AFTER ... FOR EACH STATEMENT).")));
	tuple = TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event) ? trigdata->tg_newtuple :
		trigdata->tg_trigtuple;
	{
		char	   *subject = row_subject(tuple, desc, &args);

		charge_subject(fcinfo, &args, subject, row_cost(tuple, desc, &args));
		pfree(subject);
	}
	return TRIGGER_FIRED_BEFORE(trigdata->tg_event) ? PointerGetDatum(tuple) : PointerGetDatum(NULL);
}

PG_FUNCTION_INFO_V1(rl_policy_invalidate);

/* Statement trigger on rl_policy: every backend drops its cache once this commits. */
Datum
rl_policy_invalidate(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("_rl_policy_invalidate must be called as a trigger"),
				 errhint("It is the extension's own trigger function: do not call it.")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	policy_cache_changed();
	PG_RETURN_POINTER(NULL);
}

PG_FUNCTION_INFO_V1(rl_history_restored);

/*
 * rl_history_restored(key, mark): for the history triggers. With mark, notes
 * that a row with key was inserted by a restore (rl_inserted_version kept its
 * version while the history was empty) and returns true; without, returns
 * whether that row was noted, and forgets it. A row of the restore is then
 * not recorded again: the restored history holds it.
 */
Datum
rl_history_restored(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(policy_restored_row(text_to_cstring(PG_GETARG_TEXT_PP(0)), PG_GETARG_BOOL(1)));
}
