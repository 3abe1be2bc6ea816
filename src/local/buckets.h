/*
 * buckets.h
 *	  Emergency buckets (of every algorithm but the log) in shared memory, for fail_mode 'local'.
 */
#ifndef RL_LOCAL_BUCKETS_H
#define RL_LOCAL_BUCKETS_H

#include "algorithm/limit.h"
#include "local/table.h"

extern SharedTable local_buckets_table;

extern bool local_available(void);
extern void local_apply(const LimitParams *params, const LocalKey *key, int64 now_ms,
						int64 cost, LimitMode mode, LimitResult *result);
extern void local_usage(int *in_use, int *slots);

#endif							/* RL_LOCAL_BUCKETS_H */
