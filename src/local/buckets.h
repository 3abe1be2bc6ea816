/*
 * buckets.h
 *	  Emergency buckets (of every algorithm but the log) in shared memory, for fail_mode 'local'.
 */
#ifndef RL_LOCAL_BUCKETS_H
#define RL_LOCAL_BUCKETS_H

#include "algorithm/limit.h"
#include "local/keys.h"

extern void local_init(bool preloaded);
extern Size local_shmem_size(void);
extern void local_shmem_request(void);
extern void local_shmem_init(void);
extern bool local_available(void);
extern void local_apply(const LimitParams *params, const LocalKey *key, int64 now_ms,
						int64 cost, LimitMode mode, LimitResult *result);
extern void local_usage(int *in_use, int *slots);

#endif							/* RL_LOCAL_BUCKETS_H */
