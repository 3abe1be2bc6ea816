/*
 * monitoring.c
 *	  The functions that watch the limiter: rl_health, rl_stats_read,
 *	  rl_stats_reset, rl_subject_hash, rl_local_available.
 */
#include "prelude.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "base/log_privacy.h"
#include "local/buckets.h"
#include "observe/stats.h"
#include "policy/subject.h"
#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/connection.h"

/*
 * One row of rl_health for breaker i (false: not the current URL's): its
 * node reachable or not since when,
 * the breaker, the last error and when, the node, the slots this backend
 * sends there; and the local buckets. natts: 8 (before 0.5.0), 10 (before
 * 0.6.0) or 11.
 */
static bool
health_row(int i, int natts, Datum *values, bool *nulls)
{
	BreakerHealth health;
	int			in_use,
				slots;
	const char *node;
	int			index;

	if (!breaker_health(i, &health))
		return false;
	local_usage(&in_use, &slots);
	memset(nulls, 0, 11 * sizeof(bool));
	values[0] = BoolGetDatum(health.reachable);
	values[1] = TimestampTzGetDatum(health.since);
	nulls[1] = health.since == 0;
	values[2] = CStringGetTextDatum(health.open ? "open" : "closed");
	values[3] = Int64GetDatum(health.retry_in_ms);
	if (health.last_failure.kind == REDIS_FAILURE_NONE)
		nulls[4] = true;
	else
		values[4] = CStringGetTextDatum(psprintf("%s: %s",
												 redis_failure_kind_name(health.last_failure.kind),
												 health.last_failure.detail));
	values[5] = Int32GetDatum(in_use);
	values[6] = Int32GetDatum(slots);
	values[7] = BoolGetDatum(health.shared);
	if (natts < 10)
		return true;
	/* Since 0.5.0: when the last error was seen, and the node. */
	values[8] = TimestampTzGetDatum(health.last_failure_at);
	nulls[8] = health.last_failure.kind == REDIS_FAILURE_NONE;
	/* A Sentinel or unix URL's one breaker: the node this backend is connected to. */
	index = cluster_node_index(health.node);
	node = health.node[0] != '\0' ? health.node : connection_node(0);
	values[9] = CStringGetTextDatum(node);
	nulls[9] = node[0] == '\0';
	if (natts < 11)
		return true;
	/* Since 0.6.0: the slots of a cluster node (NULL when this backend has no map of them). */
	values[10] = Int32GetDatum(index >= 0 ? cluster_node_slots(index) : 0);
	nulls[10] = index < 0 || !cluster_enabled();
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
	Datum		values[11];
	bool		nulls[11];

	/* Before the first call, the URL's own node (its breaker, still closed). */
	cluster_prepare();
	(void) breaker_for(cluster_node_name(0));
	if (fcinfo->flinfo->fn_retset)
	{
		InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
		for (int i = 0; i < breaker_node_count(); i++)
			if (health_row(i, rsinfo->setDesc->natts, values, nulls))
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		return (Datum) 0;
	}
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("function returning a record called in a context that cannot accept it")));
	/* The first row of the current URL's. */
	{
		bool		found = false;

		for (int i = 0; i < breaker_node_count() && !found; i++)
			found = health_row(i, desc->natts, values, nulls);
		if (!found)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("the table of Redis nodes is full"),
					 errhint("Restart the server to empty it; ALTER EXTENSION ratelimit UPDATE lists every node.")));
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
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

/* Appends row to the result set. */
static void
stats_put_row(ReturnSetInfo *rsinfo, const StatsRow *row)
{
	Datum		values[21];
	bool		nulls[21] = {0};
	int			n = 0;
	/* Until ALTER EXTENSION UPDATE to 0.8, the function has no source_allowance. */
	bool		allowance = rsinfo->setDesc->natts == lengthof(values);

	values[n++] = CStringGetTextDatum(row->policy[0] ? row->policy : "(other)");
	values[n++] = Int64GetDatum(row->allowed + row->denied);
	values[n++] = Int64GetDatum(row->allowed);
	values[n++] = Int64GetDatum(row->denied);
	values[n++] = Int64GetDatum(row->tokens);
	values[n++] = Int64GetDatum(row->shadow_denials);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_REDIS]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_LOCAL]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_FAIL_OPEN]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_FAIL_CLOSED]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_OVERRIDE]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_DISABLED]);
	values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_DENY_CACHE]);
	if (allowance)
		values[n++] = Int64GetDatum(row->by_source[DECISION_SOURCE_ALLOWANCE]);
	values[n++] = Int64GetDatum(row->redis_calls);
	values[n++] = failures_jsonb(row);
	/* Without a round trip there is no latency to tell. */
	nulls[n] = nulls[n + 1] = nulls[n + 2] = row->round_trips == 0;
	values[n++] = ms_datum(stats_latency_quantile(row, 0.50));
	values[n++] = ms_datum(stats_latency_quantile(row, 0.99));
	values[n++] = ms_datum(row->latency_max_us);
	values[n++] = histogram_jsonb(row);
	values[n++] = TimestampTzGetDatum(row->reset_at);
	Assert(n == rsinfo->setDesc->natts);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
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
