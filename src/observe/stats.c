/*
 * stats.c
 *	  rl_stats: per-policy counters of decisions and Redis calls, in shared memory.
 *
 * Each (database, policy) gets an entry of atomic counters the first time it
 * decides; entries are never removed (a reset zeroes them), so a backend keeps
 * pointers to them in a local hash and counting takes no lock: a few atomic
 * adds per decision. When ratelimit.stats_policies entries are taken, further
 * policies are counted together in one entry, shown as "(other)". Never a
 * subject: only policy names and numbers.
 *
 * Redis round trips go into a histogram of four buckets per power of two of
 * microseconds (resolution within 25%), from which p50 and p99 are read as the
 * upper bound of the bucket that holds them, capped at the largest seen.
 */
#include "ratelimit.h"

#include <math.h>

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "decision.h"
#include "log_privacy.h"
#include "redis.h"
#include "stats.h"

/* Buckets of the round-trip histogram: 0-3 µs exactly, then four per power of two. */
#define STATS_LATENCY_OCTAVES 30	/* up to 2^30 µs, about 18 minutes */
#define STATS_LATENCY_BUCKETS (4 * (STATS_LATENCY_OCTAVES - 1))

/* The counters of an entry. */
typedef enum StatsCounter
{
	COUNT_ALLOWED,				/* decisions = allowed + denied */
	COUNT_DENIED,
	COUNT_TOKENS,
	COUNT_SHADOW_DENIALS,
	COUNT_REDIS_CALLS,
	COUNT_SOURCE,				/* one per DecisionSource from here */
	COUNT_FAILURE = COUNT_SOURCE + DECISION_SOURCE_OVERRIDE + 1,	/* one per RedisFailureKind */
	COUNT_ALL = COUNT_FAILURE + REDIS_FAILURE_KINDS
} StatsCounter;

typedef struct StatsKey
{
	Oid			database;
	char		policy[NAMEDATALEN];	/* "" for the entry that counts the rest */
} StatsKey;

typedef struct StatsEntry
{
	StatsKey	key;
	pg_atomic_uint64 counters[COUNT_ALL];
	pg_atomic_uint64 latency[STATS_LATENCY_BUCKETS];
	pg_atomic_uint64 latency_max_us;
	pg_atomic_uint64 reset_at;	/* a TimestampTz */
} StatsEntry;

typedef struct StatsShared
{
	LWLock	   *lock;			/* guards adding entries to the hash */
	StatsEntry *other;			/* counts policies beyond stats_policies */
} StatsShared;

static StatsShared *stats_shared = NULL;
static HTAB *stats_hash = NULL;

/* This backend's pointers to its database's entries, by policy name. */
typedef struct StatsLocal
{
	char		policy[NAMEDATALEN];	/* hash key */
	StatsEntry *entry;
} StatsLocal;

static HTAB *stats_local = NULL;

/* Shared memory for the entries, requested from _PG_init's hook. */
Size
stats_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(rl_stats_policies + 1, sizeof(StatsEntry)));
}

void
stats_shmem_request(void)
{
	RequestNamedLWLockTranche("ratelimit stats", 1);
}

static void
stats_entry_zero(StatsEntry *entry)
{
	for (int i = 0; i < COUNT_ALL; i++)
		pg_atomic_init_u64(&entry->counters[i], 0);
	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
		pg_atomic_init_u64(&entry->latency[i], 0);
	pg_atomic_init_u64(&entry->latency_max_us, 0);
	pg_atomic_init_u64(&entry->reset_at, (uint64) GetCurrentTimestamp());
}

/* Creates or attaches to the entries; called with AddinShmemInitLock held. */
void
stats_shmem_init(void)
{
	HASHCTL		hashctl = {0};
	bool		found;
	StatsKey	other_key = {0};

	stats_shared = ShmemInitStruct("ratelimit stats", sizeof(StatsShared), &found);
	hashctl.keysize = sizeof(StatsKey);
	hashctl.entrysize = sizeof(StatsEntry);
	stats_hash = ShmemInitHash("ratelimit stats entries", rl_stats_policies + 1,
							   rl_stats_policies + 1, &hashctl,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	if (!found)
	{
		stats_shared->lock = &(GetNamedLWLockTranche("ratelimit stats"))->lock;
		stats_shared->other = hash_search(stats_hash, &other_key, HASH_ENTER, NULL);
		stats_entry_zero(stats_shared->other);
	}
}

/* The entry that counts policy in this database; NULL without shared memory. */
static StatsEntry *
stats_entry(const char *policy)
{
	/* Most calls decide the policy the last one did: no hashing then. */
	static char last_policy[NAMEDATALEN];
	static StatsEntry *last_entry = NULL;
	StatsLocal *local;
	bool		found;

	if (stats_hash == NULL)
		return NULL;
	if (last_entry != NULL && strcmp(last_policy, policy) == 0)
		return last_entry;
	if (stats_local == NULL)
	{
		HASHCTL		hashctl = {0};

		hashctl.keysize = NAMEDATALEN;
		hashctl.entrysize = sizeof(StatsLocal);
		hashctl.hcxt = TopMemoryContext;
		stats_local = hash_create("ratelimit stats pointers", 64, &hashctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	local = hash_search(stats_local, policy, HASH_ENTER, &found);
	if (!found)
	{
		StatsKey	key = {.database = MyDatabaseId};
		StatsEntry *entry;

		strlcpy(key.policy, policy, sizeof(key.policy));
		LWLockAcquire(stats_shared->lock, LW_SHARED);
		entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
		LWLockRelease(stats_shared->lock);
		if (entry == NULL)
		{
			LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
			entry = hash_search(stats_hash, &key, HASH_ENTER_NULL, &found);
			if (entry != NULL && !found)
				stats_entry_zero(entry);
			LWLockRelease(stats_shared->lock);
		}
		local->entry = entry != NULL ? entry : stats_shared->other;
	}
	strlcpy(last_policy, policy, sizeof(last_policy));
	last_entry = local->entry;
	return local->entry;
}

static inline void
count(StatsEntry *entry, StatsCounter counter, uint64 amount)
{
	pg_atomic_fetch_add_u64(&entry->counters[counter], amount);
}

/* Counts one decision that spends (a take, a lease): cost is what it asked for. */
void
stats_decision(const Decision *decision, int64 cost)
{
	StatsEntry *entry = rl_track_stats ? stats_entry(decision->policy) : NULL;

	if (entry == NULL)
		return;
	count(entry, decision->allowed ? COUNT_ALLOWED : COUNT_DENIED, 1);
	/* Tokens were taken only where a bucket granted them. */
	if (decision->allowed &&
		(decision->source == DECISION_SOURCE_REDIS || decision->source == DECISION_SOURCE_LOCAL))
		count(entry, COUNT_TOKENS, (uint64) cost);
	if (decision->source == DECISION_SOURCE_SHADOW)
		count(entry, COUNT_SHADOW_DENIALS, 1);
	/* By who decided: a shadow denial by the bucket that would have denied. */
	count(entry, COUNT_SOURCE + (decision->source == DECISION_SOURCE_SHADOW ?
								 decision->origin : decision->source), 1);
}

/* The histogram bucket of a round trip of us microseconds. */
static int
latency_bucket(int64 us)
{
	int			octave;

	if (us < 4)
		return (int) Max(us, 0);
	octave = pg_leftmost_one_pos64((uint64) us);
	if (octave >= STATS_LATENCY_OCTAVES)
		return STATS_LATENCY_BUCKETS - 1;
	return 4 * (octave - 1) + (int) ((us >> (octave - 2)) & 3);
}

/* The exclusive upper bound, in microseconds, of histogram bucket i. */
static int64
latency_bucket_limit(int i)
{
	if (i < 4)
		return i + 1;
	return (int64) (5 + i % 4) << (i / 4 - 1);
}

/*
 * Counts one Redis call made for policy: its round trip when Redis answered,
 * its failure class when not. A call the breaker skipped counts nothing.
 */
void
stats_redis(const char *policy, bool answered, const RedisFailure *failure)
{
	StatsEntry *entry;
	uint64		max;
	int64		us = redis_last_round_trip_us;

	if (!rl_track_stats || (!answered && failure->kind == REDIS_FAILURE_NONE))
		return;
	entry = stats_entry(policy);
	if (entry == NULL)
		return;
	count(entry, COUNT_REDIS_CALLS, 1);
	if (failure->kind != REDIS_FAILURE_NONE)
		count(entry, COUNT_FAILURE + failure->kind, 1);
	if (us < 0)
		return;
	pg_atomic_fetch_add_u64(&entry->latency[latency_bucket(us)], 1);
	max = pg_atomic_read_u64(&entry->latency_max_us);
	while ((uint64) us > max &&
		   !pg_atomic_compare_exchange_u64(&entry->latency_max_us, &max, (uint64) us))
		;
}

/* Raises 55000 when the counters do not exist (the library was not preloaded). */
static void
stats_check_available(void)
{
	if (stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("rl_stats needs ratelimit in shared_preload_libraries"),
				 errdetail("The counters live in shared memory, which only a preloaded library has."),
				 errhint("Add ratelimit to shared_preload_libraries and restart the server.")));
}

/* Milliseconds, for the view, of a microsecond figure. */
static Datum
ms_datum(int64 us)
{
	return Float8GetDatum((double) us / 1000.0);
}

/* The round trip at quantile q (0..1) of the histogram: its bucket's upper bound, at most max. */
static int64
latency_quantile(const uint64 *latency, uint64 total, int64 max, double q)
{
	uint64		rank = (uint64) ceil(q * (double) total);
	uint64		seen = 0;

	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		seen += latency[i];
		if (seen >= rank)
			return Min(latency_bucket_limit(i), max);
	}
	return max;
}

/* A jsonb object of the failure classes that occurred, by name. */
static Datum
failures_jsonb(const uint64 *counters)
{
	StringInfoData json;
	bool		first = true;

	initStringInfo(&json);
	appendStringInfoChar(&json, '{');
	for (int kind = REDIS_FAILURE_CONFIG; kind < REDIS_FAILURE_KINDS; kind++)
	{
		if (counters[COUNT_FAILURE + kind] == 0)
			continue;
		appendStringInfo(&json, "%s\"%s\": " UINT64_FORMAT, first ? "" : ", ",
						 redis_failure_kind_name((RedisFailureKind) kind),
						 counters[COUNT_FAILURE + kind]);
		first = false;
	}
	appendStringInfoChar(&json, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

/* A jsonb array of the histogram's non-empty buckets: [{"le_ms": bound, "count": n}, ...]. */
static Datum
histogram_jsonb(const uint64 *latency)
{
	StringInfoData json;
	bool		first = true;

	initStringInfo(&json);
	appendStringInfoChar(&json, '[');
	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		if (latency[i] == 0)
			continue;
		appendStringInfo(&json, "%s{\"le_ms\": %.3f, \"count\": " UINT64_FORMAT "}",
						 first ? "" : ", ", latency_bucket_limit(i) / 1000.0, latency[i]);
		first = false;
	}
	appendStringInfoChar(&json, ']');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(json.data));
}

/* Appends entry's row (a snapshot of its counters) to the result set. */
static void
stats_put_row(ReturnSetInfo *rsinfo, const StatsEntry *entry)
{
	uint64		counters[COUNT_ALL];
	uint64		latency[STATS_LATENCY_BUCKETS];
	uint64		calls = 0;
	int64		max;
	Datum		values[19];
	bool		nulls[19] = {0};
	int			n = 0;

	for (int i = 0; i < COUNT_ALL; i++)
		counters[i] = pg_atomic_read_u64((pg_atomic_uint64 *) &entry->counters[i]);
	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		latency[i] = pg_atomic_read_u64((pg_atomic_uint64 *) &entry->latency[i]);
		calls += latency[i];
	}
	max = (int64) pg_atomic_read_u64((pg_atomic_uint64 *) &entry->latency_max_us);

	values[n++] = CStringGetTextDatum(entry->key.policy[0] ? entry->key.policy : "(other)");
	values[n++] = Int64GetDatum(counters[COUNT_ALLOWED] + counters[COUNT_DENIED]);
	values[n++] = Int64GetDatum(counters[COUNT_ALLOWED]);
	values[n++] = Int64GetDatum(counters[COUNT_DENIED]);
	values[n++] = Int64GetDatum(counters[COUNT_TOKENS]);
	values[n++] = Int64GetDatum(counters[COUNT_SHADOW_DENIALS]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_REDIS]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_LOCAL]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_FAIL_OPEN]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_FAIL_CLOSED]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_OVERRIDE]);
	values[n++] = Int64GetDatum(counters[COUNT_SOURCE + DECISION_SOURCE_DISABLED]);
	values[n++] = Int64GetDatum(counters[COUNT_REDIS_CALLS]);
	values[n++] = failures_jsonb(counters);
	/* Without a round trip there is no latency to tell. */
	nulls[n] = nulls[n + 1] = nulls[n + 2] = calls == 0;
	values[n++] = ms_datum(latency_quantile(latency, calls, max, 0.50));
	values[n++] = ms_datum(latency_quantile(latency, calls, max, 0.99));
	values[n++] = ms_datum(max);
	values[n++] = histogram_jsonb(latency);
	values[n++] = TimestampTzGetDatum((TimestampTz) pg_atomic_read_u64((pg_atomic_uint64 *) &entry->reset_at));
	Assert(n == lengthof(values));
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/* rl_stats_read(): a row per policy of this database that decided since start, and "(other)". */
RL_SQL_FUNCTION(rl_stats_read)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS status;
	StatsEntry *entry;

	stats_check_available();
	InitMaterializedSRF(fcinfo, 0);
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&status, stats_hash);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		if (entry == stats_shared->other)
		{
			if (pg_atomic_read_u64(&entry->counters[COUNT_ALLOWED]) == 0 &&
				pg_atomic_read_u64(&entry->counters[COUNT_DENIED]) == 0 &&
				pg_atomic_read_u64(&entry->counters[COUNT_REDIS_CALLS]) == 0)
				continue;
		}
		else if (entry->key.database != MyDatabaseId)
			continue;
		stats_put_row(rsinfo, entry);
	}
	LWLockRelease(stats_shared->lock);
	return (Datum) 0;
}

/* rl_stats_reset(): zeroes this database's counters (and those counted together). */
RL_SQL_FUNCTION(rl_stats_reset)
{
	HASH_SEQ_STATUS status;
	StatsEntry *entry;

	stats_check_available();
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	hash_seq_init(&status, stats_hash);
	while ((entry = hash_seq_search(&status)) != NULL)
		if (entry == stats_shared->other || entry->key.database == MyDatabaseId)
		{
			for (int i = 0; i < COUNT_ALL; i++)
				pg_atomic_write_u64(&entry->counters[i], 0);
			for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
				pg_atomic_write_u64(&entry->latency[i], 0);
			pg_atomic_write_u64(&entry->latency_max_us, 0);
			pg_atomic_write_u64(&entry->reset_at, (uint64) GetCurrentTimestamp());
		}
	LWLockRelease(stats_shared->lock);
	ereport(LOG,
			(errhidestmt(true),
			 errmsg("ratelimit: statistics reset")));
	PG_RETURN_VOID();
}
