/*
 * cache.h
 *	  The per-backend cache of rl_policy and rl_override rows.
 */
#ifndef RL_POLICY_CACHE_H
#define RL_POLICY_CACHE_H

#include "policy/policy.h"

extern void policy_cache_init(void);
extern Size policy_shmem_size(void);
extern void policy_shmem_init(void);
extern const Policy *policy_lookup(Oid function_oid, const char *name);
extern void policy_apply_override(Policy *policy, const char *subject, int length);
extern bool policy_limits(Oid function_oid, const char *name, int32 version, Policy *out);
extern void policy_cache_changed(void);
extern void policy_prepared_committed(void);
extern bool policy_restored_row(const char *key, bool mark);

#endif							/* RL_POLICY_CACHE_H */
