/*
 * token_bucket.h
 *	  The token bucket in exact integer units: its scripts in Redis
 *	  (lua/token_bucket/), the numbers they take, and the same decision in C
 *	  for buckets kept here.
 */
#ifndef RL_TOKEN_BUCKET_H
#define RL_TOKEN_BUCKET_H

#include "algorithm/limit.h"

/* The numbers each script takes per bucket, after the clock. */
#define TOKEN_BUCKET_ARGS 5

extern const LimitOps token_bucket_ops;

extern void token_bucket_args(const LimitParams *params, int64 cost, const char **args);
extern void token_bucket_group_part(const LimitParams *params, const char *key, int64 cost,
									int64 at_ms, LimitCall *part);
extern int	token_bucket_reset_keys(const LimitParams *params, const char *key, int64 at_ms,
									const char **keys);
extern bool bucket_params_init(LimitParams *params, int64 capacity,
							   int64 refill_amount, int64 refill_period_ms,
							   int64 idle_ttl_ms);
extern int64 bucket_refill_ms(const LimitParams *params);
extern void bucket_apply(const LimitParams *params, SubjectState *state, int64 now_ms,
						 int64 cost, LimitMode mode, LimitResult *result);

#endif							/* RL_TOKEN_BUCKET_H */
