/*
 * stats.h
 *	  rl_stats: per-policy counters of decisions and Redis calls, in shared memory.
 */
#ifndef RL_STATS_H
#define RL_STATS_H

#include "decision.h"
#include "redis.h"

extern Size stats_shmem_size(void);
extern void stats_shmem_request(void);
extern void stats_shmem_init(void);
extern void stats_decision(const Decision *decision, int64 cost);
extern void stats_redis(const char *policy, bool answered, const RedisFailure *failure);

#endif							/* RL_STATS_H */
