/*
 * stats.h
 *	  rl_stats: per-policy counters of decisions and Redis calls, in shared memory.
 */
#ifndef RL_STATS_H
#define RL_STATS_H

#include "datatype/timestamp.h"
#include "nodes/pg_list.h"

#include "engine/decision.h"

/* Buckets of the round-trip histogram: 0-3 µs exactly, then four per power of two. */
#define STATS_LATENCY_OCTAVES 30	/* up to 2^30 µs, about 18 minutes */
#define STATS_LATENCY_BUCKETS (4 * (STATS_LATENCY_OCTAVES - 1))

/* A snapshot of one policy's counters (policy "" counts the policies beyond the limit). */
typedef struct StatsRow
{
	char		policy[NAMEDATALEN];
	uint64		allowed;
	uint64		denied;
	uint64		tokens;
	uint64		shadow_denials;
	uint64		redis_calls;
	uint64		by_source[DECISION_SOURCES];
	uint64		failures[REDIS_FAILURE_KINDS];
	uint64		latency[STATS_LATENCY_BUCKETS];
	uint64		round_trips;	/* the histogram's total */
	int64		latency_max_us;
	TimestampTz reset_at;
} StatsRow;

extern void stats_init(bool preloaded);
extern Size stats_shmem_size(void);
extern void stats_shmem_request(void);
extern void stats_shmem_init(void);
extern void stats_decision(const Decision *decision, int64 cost);
extern void stats_redis(const char *policy, bool answered, const RedisFailure *failure,
						int64 round_trip_us);
extern List *stats_rows(void);
extern int64 stats_latency_quantile(const StatsRow *row, double q);
extern int64 stats_latency_bucket_limit(int i);
extern void stats_reset(void);

#endif							/* RL_STATS_H */
