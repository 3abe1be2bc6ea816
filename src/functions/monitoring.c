/*
 * monitoring.c
 *	  The functions that watch the limiter: rl_health, rl_stats_read,
 *	  rl_stats_reset, rl_top, rl_subject_hash, rl_local_available.
 */
#include "prelude.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "base/log_privacy.h"
#include "functions/args.h"
#include "local/buckets.h"
#include "observe/stats.h"
#include "observe/top.h"
#include "policy/subject.h"
#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/connection.h"

/*
 * Fills row with rl_health's columns for breaker i (false: not the current
 * URL's): its node reachable or not since when, the breaker, the last error
 * and when, the node, the slots this backend sends there; and the local
 * buckets. Older versions' rows have fewer of these columns.
 */
static bool
health_row(int i, ArgsRow *row)
{
	BreakerHealth health;
	int			in_use,
				slots;
	const char *node;
	int			index;

	if (!breaker_health(i, &health))
		return false;
	local_usage(&in_use, &slots);
	args_row_set(row, "redis_reachable", BOOLOID, BoolGetDatum(health.reachable));
	if (health.since != 0)
		args_row_set(row, "since", TIMESTAMPTZOID, TimestampTzGetDatum(health.since));
	args_row_set(row, "breaker", TEXTOID, CStringGetTextDatum(health.open ? "open" : "closed"));
	args_row_set(row, "retry_in_ms", INT8OID, Int64GetDatum(health.retry_in_ms));
	if (health.last_failure.kind != REDIS_FAILURE_NONE)
	{
		args_row_set(row, "last_error", TEXTOID,
					 CStringGetTextDatum(psprintf("%s: %s",
												  redis_failure_kind_name(health.last_failure.kind),
												  health.last_failure.detail)));
		args_row_set(row, "last_error_at", TIMESTAMPTZOID,
					 TimestampTzGetDatum(health.last_failure_at));
	}
	args_row_set(row, "local_buckets_in_use", INT4OID, Int32GetDatum(in_use));
	args_row_set(row, "local_buckets", INT4OID, Int32GetDatum(slots));
	args_row_set(row, "shared", BOOLOID, BoolGetDatum(health.shared));
	/* A Sentinel or unix URL's one breaker: the node this backend is connected to. */
	index = cluster_node_index(health.node);
	node = health.node[0] != '\0' ? health.node : connection_node(0);
	if (node[0] != '\0')
		args_row_set(row, "node", TEXTOID, CStringGetTextDatum(node));
	/* The slots of a cluster node (NULL when this backend has no map of them). */
	if (index >= 0 && cluster_enabled())
		args_row_set(row, "slots", INT4OID, Int32GetDatum(cluster_node_slots(index)));
	return true;
}

/*
 * rl_health(): a row for each node the server has a breaker for (one, unless
 * Redis is a cluster). Installations not yet updated to 0.6.0 call it for
 * one row, that of the first node.
 */
RL_SQL_FUNCTION(rl_health)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	desc;
	ArgsRow		row;
	bool		found = false;

	/* Before the first call, the URL's own node (its breaker, still closed). */
	cluster_prepare();
	(void) breaker_for(cluster_node_name(0));
	if (fcinfo->flinfo->fn_retset)
	{
		InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
		for (int i = 0; i < breaker_node_count(); i++)
		{
			args_row_start(&row, rsinfo->setDesc);
			if (health_row(i, &row))
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row.values, row.nulls);
		}
		return (Datum) 0;
	}
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("function returning a record called in a context that cannot accept it"),
				 errhint("Call it in a FROM clause, as in SELECT * FROM rl_health().")));
	/* The first row of the current URL's. */
	for (int i = 0; i < breaker_node_count() && !found; i++)
	{
		args_row_start(&row, desc);
		found = health_row(i, &row);
	}
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("the table of Redis nodes is full"),
				 errhint("Restart the server to empty it; ALTER EXTENSION ratelimit UPDATE lists every node.")));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), row.values, row.nulls)));
}

/* Milliseconds, for the view, of a microsecond figure. */
static Datum
ms_datum(int64 us)
{
	return Float8GetDatum((double) us / 1000.0);
}

/* A jsonb object of the failure classes that occurred, by name. */
static Datum
failures_jsonb(const StatsRow *row)
{
	StringInfoData json;
	bool		first = true;

	initStringInfo(&json);
	appendStringInfoChar(&json, '{');
	for (int kind = REDIS_FAILURE_CONFIG; kind < REDIS_FAILURE_KINDS; kind++)
	{
		if (row->failures[kind] == 0)
			continue;
		appendStringInfo(&json, "%s\"%s\": " UINT64_FORMAT, first ? "" : ", ",
						 redis_failure_kind_name((RedisFailureKind) kind), row->failures[kind]);
		first = false;
	}
	appendStringInfoChar(&json, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

/* A jsonb array of the histogram's non-empty buckets: [{"le_ms": bound, "count": n}, ...]. */
static Datum
histogram_jsonb(const StatsRow *row)
{
	StringInfoData json;
	bool		first = true;

	initStringInfo(&json);
	appendStringInfoChar(&json, '[');
	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		if (row->latency[i] == 0)
			continue;
		appendStringInfo(&json, "%s{\"le_ms\": %.3f, \"count\": " UINT64_FORMAT "}",
						 first ? "" : ", ", stats_latency_bucket_limit(i) / 1000.0,
						 row->latency[i]);
		first = false;
	}
	appendStringInfoChar(&json, ']');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

/* Sets a counter column of row. */
static void
set_count(ArgsRow *row, const char *column, uint64 count)
{
	args_row_set(row, column, INT8OID, Int64GetDatum((int64) count));
}

/* Appends stats to the result set, in the columns its version of rl_stats has. */
static void
stats_put_row(ReturnSetInfo *rsinfo, const StatsRow *stats)
{
	ArgsRow		row;

	args_row_start(&row, rsinfo->setDesc);
	args_row_set(&row, "policy", TEXTOID,
				 CStringGetTextDatum(stats->policy[0] ? stats->policy : "(other)"));
	set_count(&row, "decisions", stats->allowed + stats->denied);
	set_count(&row, "allowed", stats->allowed);
	set_count(&row, "denied", stats->denied);
	set_count(&row, "tokens_granted", stats->tokens);
	set_count(&row, "shadow_denials", stats->shadow_denials);
	set_count(&row, "source_redis", stats->by_source[DECISION_SOURCE_REDIS]);
	set_count(&row, "source_local", stats->by_source[DECISION_SOURCE_LOCAL]);
	set_count(&row, "source_fail_open", stats->by_source[DECISION_SOURCE_FAIL_OPEN]);
	set_count(&row, "source_fail_closed", stats->by_source[DECISION_SOURCE_FAIL_CLOSED]);
	set_count(&row, "source_override", stats->by_source[DECISION_SOURCE_OVERRIDE]);
	set_count(&row, "source_disabled", stats->by_source[DECISION_SOURCE_DISABLED]);
	set_count(&row, "source_deny_cache", stats->by_source[DECISION_SOURCE_DENY_CACHE]);
	set_count(&row, "source_allowance", stats->by_source[DECISION_SOURCE_ALLOWANCE]);
	set_count(&row, "source_replay", stats->by_source[DECISION_SOURCE_REPLAY]);
	set_count(&row, "redis_calls", stats->redis_calls);
	args_row_set(&row, "redis_errors", JSONBOID, failures_jsonb(stats));
	/* Without a round trip there is no latency to tell. */
	if (stats->round_trips > 0)
	{
		args_row_set(&row, "latency_p50_ms", FLOAT8OID, ms_datum(stats_latency_quantile(stats, 0.50)));
		args_row_set(&row, "latency_p99_ms", FLOAT8OID, ms_datum(stats_latency_quantile(stats, 0.99)));
		args_row_set(&row, "latency_max_ms", FLOAT8OID, ms_datum(stats->latency_max_us));
	}
	args_row_set(&row, "latency_histogram", JSONBOID, histogram_jsonb(stats));
	args_row_set(&row, "stats_reset", TIMESTAMPTZOID, TimestampTzGetDatum(stats->reset_at));
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row.values, row.nulls);
}

/* rl_stats_read(): a row per policy of this database that decided since start, and "(other)". */
RL_SQL_FUNCTION(rl_stats_read)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *rows = stats_rows();
	ListCell   *cell;

	InitMaterializedSRF(fcinfo, 0);
	foreach(cell, rows)
		stats_put_row(rsinfo, lfirst(cell));
	return (Datum) 0;
}

/* rl_stats_reset(): zeroes this database's counters (and those counted together). */
RL_SQL_FUNCTION(rl_stats_reset)
{
	stats_reset();
	ereport(LOG,
			(errhidestmt(true),
			 errmsg("ratelimit: statistics reset")));
	PG_RETURN_VOID();
}

/*
 * True when the caller may see subjects: it may read rl_override (beside
 * function_oid, in the extension's schema), which holds subjects anyway.
 */
static bool
shows_subjects(Oid function_oid)
{
	Oid			relid = get_relname_relid("rl_override", get_func_namespace(function_oid));

	return OidIsValid(relid) && pg_class_aclcheck(relid, GetUserId(), ACL_SELECT) == ACLCHECK_OK;
}

/*
 * rl_top(policy): the subjects of policy most denied and most served lately
 * on this server (observe/top.c): kind, rank, subject (NULL unless the caller
 * may see subjects), its keyed hash, count, error, total.
 */
RL_SQL_FUNCTION(rl_top)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	List	   *rows;
	ListCell   *cell;
	bool		shows;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("policy must not be null"),
				 errhint("Pass a policy name from rl_policy.")));
	rows = top_read(TextDatumGetCString(PG_GETARG_DATUM(0)));
	shows = shows_subjects(fcinfo->flinfo->fn_oid);
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	foreach(cell, rows)
	{
		TopRow	   *top = lfirst(cell);
		ArgsRow		row;

		args_row_start(&row, rsinfo->setDesc);
		args_row_set(&row, "kind", TEXTOID, CStringGetTextDatum(top->kind));
		args_row_set(&row, "rank", INT4OID, Int32GetDatum(top->rank));
		if (shows)
			args_row_set(&row, "subject", TEXTOID,
						 PointerGetDatum(cstring_to_text_with_len(top->subject, top->length)));
		args_row_set(&row, "subject_hash", TEXTOID, CStringGetTextDatum(top->hash));
		args_row_set(&row, "count", INT8OID, Int64GetDatum(top->count));
		args_row_set(&row, "error", INT8OID, Int64GetDatum(top->error));
		args_row_set(&row, "total", INT8OID, Int64GetDatum(top->total));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, row.values, row.nulls);
	}
	return (Datum) 0;
}

/* rl_subject_hash(subject): the hash the decision log writes for subject. */
RL_SQL_FUNCTION(rl_subject_hash)
{
	text	   *subject = PG_GETARG_TEXT_PP(0);
	StringInfoData hash;

	subject_check(VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject));
	initStringInfo(&hash);
	subject_hash(&hash, VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject));
	PG_RETURN_TEXT_P(cstring_to_text(hash.data));
}

PG_FUNCTION_INFO_V1(rl_local_available);

/* rl_local_available(): true when local fallback buckets exist (the library was preloaded). */
Datum
rl_local_available(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(local_available());
}
