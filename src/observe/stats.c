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
#include "prelude.h"

#include <math.h>

#include "miscadmin.h"
#include "port/atomics.h"
#include "port/pg_bitutils.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "observe/stats.h"

static bool track_stats = true;
static int	stats_policies = 1000;

/* The counters of an entry. */
typedef enum StatsCounter
{
	COUNT_ALLOWED,				/* decisions = allowed + denied */
	COUNT_DENIED,
	COUNT_TOKENS,
	COUNT_SHADOW_DENIALS,
	COUNT_REDIS_CALLS,
	COUNT_SOURCE,				/* one per DecisionSource from here */
	COUNT_FAILURE = COUNT_SOURCE + DECISION_SOURCES,	/* one per RedisFailureKind */
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

/*
 * Defines ratelimit.track_stats, and when preloading (the counters live in
 * shared memory) ratelimit.stats_policies, which sizes them.
 */
void
stats_init(bool preloaded)
{
	DefineCustomBoolVariable("ratelimit.track_stats",
							 "Count decisions and Redis calls in rl_stats (needs shared_preload_libraries).",
							 NULL, &track_stats, true, PGC_SUSET, 0, NULL, NULL, NULL);
	if (preloaded)
		DefineCustomIntVariable("ratelimit.stats_policies",
								"Policies (of all databases together) that rl_stats counts apart; the rest are counted as one.",
								NULL, &stats_policies, 1000, 16, 1000 * 1000,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* Shared memory for the entries, requested from _PG_init's hook. */
Size
stats_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(StatsShared)),
					hash_estimate_size(stats_policies + 1, sizeof(StatsEntry)));
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
	stats_hash = ShmemInitHash("ratelimit stats entries", stats_policies + 1,
							   stats_policies + 1, &hashctl,
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
	StatsEntry *entry = track_stats ? stats_entry(decision->policy) : NULL;

	if (entry == NULL)
		return;
	count(entry, decision->allowed ? COUNT_ALLOWED : COUNT_DENIED, 1);
	/* Tokens were taken only where a bucket (or a slice of it) granted them. */
	if (decision->allowed &&
		(decision->source == DECISION_SOURCE_REDIS || decision->source == DECISION_SOURCE_LOCAL ||
		 decision->source == DECISION_SOURCE_ALLOWANCE))
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
int64
stats_latency_bucket_limit(int i)
{
	if (i < 4)
		return i + 1;
	return (int64) (5 + i % 4) << (i / 4 - 1);
}

/*
 * Counts one Redis call made for policy: its round trip (us, -1 for none)
 * when Redis answered, its failure class when not. A call the breaker
 * skipped counts nothing.
 */
void
stats_redis(const char *policy, bool answered, const RedisFailure *failure, int64 us)
{
	StatsEntry *entry;
	uint64		max;

	if (!track_stats || (!answered && failure->kind == REDIS_FAILURE_NONE))
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

/* A snapshot of entry's counters. */
static StatsRow *
stats_row(const StatsEntry *entry)
{
	StatsRow   *row = palloc0(sizeof(StatsRow));
	uint64		counters[COUNT_ALL];

	for (int i = 0; i < COUNT_ALL; i++)
		counters[i] = pg_atomic_read_u64((pg_atomic_uint64 *) &entry->counters[i]);
	strlcpy(row->policy, entry->key.policy, sizeof(row->policy));
	row->allowed = counters[COUNT_ALLOWED];
	row->denied = counters[COUNT_DENIED];
	row->tokens = counters[COUNT_TOKENS];
	row->shadow_denials = counters[COUNT_SHADOW_DENIALS];
	row->redis_calls = counters[COUNT_REDIS_CALLS];
	memcpy(row->by_source, &counters[COUNT_SOURCE], sizeof(row->by_source));
	memcpy(row->failures, &counters[COUNT_FAILURE], sizeof(row->failures));
	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		row->latency[i] = pg_atomic_read_u64((pg_atomic_uint64 *) &entry->latency[i]);
		row->round_trips += row->latency[i];
	}
	row->latency_max_us = (int64) pg_atomic_read_u64((pg_atomic_uint64 *) &entry->latency_max_us);
	row->reset_at = (TimestampTz) pg_atomic_read_u64((pg_atomic_uint64 *) &entry->reset_at);
	return row;
}

/*
 * Snapshots of this database's entries that decided since start, and of the
 * one that counts the rest if it counted anything: a List of StatsRow. Raises
 * 55000 without shared memory.
 */
List *
stats_rows(void)
{
	HASH_SEQ_STATUS status;
	StatsEntry *entry;
	List	   *rows = NIL;

	stats_check_available();
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
		rows = lappend(rows, stats_row(entry));
	}
	LWLockRelease(stats_shared->lock);
	return rows;
}

/* The round trip at quantile q (0..1) of row: its bucket's upper bound, at most the largest. */
int64
stats_latency_quantile(const StatsRow *row, double q)
{
	uint64		rank = (uint64) ceil(q * (double) row->round_trips);
	uint64		seen = 0;

	for (int i = 0; i < STATS_LATENCY_BUCKETS; i++)
	{
		seen += row->latency[i];
		if (seen >= rank)
			return Min(stats_latency_bucket_limit(i), row->latency_max_us);
	}
	return row->latency_max_us;
}

/* Zeroes this database's counters (and those counted together); 55000 without shared memory. */
void
stats_reset(void)
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
}
