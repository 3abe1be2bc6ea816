/*
 * token_bucket.h
 *	  The token bucket in exact integer units: its parameters, its scripts in
 *	  Redis (lua/token_bucket/), and the same decision in C for buckets kept
 *	  here.
 */
#ifndef RL_TOKEN_BUCKET_H
#define RL_TOKEN_BUCKET_H

#include "base/script.h"

/* Largest integer every value of the bucket math must stay below (Lua numbers are doubles). */
#define BUCKET_EXACT_LIMIT (INT64CONST(1) << 53)
/* Longest idle TTL (about 142,000 years): now + TTL stays below BUCKET_EXACT_LIMIT. */
#define BUCKET_MAX_TTL_MS (INT64CONST(1) << 52)

/*
 * One token is `unit` units; one millisecond adds `rate` units. Both come from
 * refill_amount / refill_period reduced by their gcd, so refill is exact.
 */
typedef struct BucketParams
{
	int64		capacity;		/* tokens */
	int64		unit;			/* units per token */
	int64		rate;			/* units added per millisecond */
	int64		capacity_units; /* capacity * unit */
	int64		ttl_ms;			/* idle TTL of the Redis key */
} BucketParams;

/* A bucket's stored state, as the scripts store it: "<level> <time>". */
typedef struct BucketState
{
	int64		level;			/* units */
	int64		last_ms;		/* time of the last write, ms since the epoch */
} BucketState;

/* What a call does to a bucket: one script each. */
typedef enum BucketMode
{
	BUCKET_TAKE,				/* take cost tokens if they are all there */
	BUCKET_PEEK,				/* the same decision, nothing taken */
	BUCKET_REFUND				/* give cost tokens back, never above capacity */
} BucketMode;

/* What a call answers: the script's reply. */
typedef struct BucketResult
{
	bool		allowed;
	int64		remaining;		/* whole tokens */
	int64		retry_after_ms;
	int64		reset_after_ms;
} BucketResult;

/* The numbers each script takes per bucket, after the clock. */
#define TOKEN_BUCKET_ARGS 5

extern const LuaScript *token_bucket_script(BucketMode mode);
extern const LuaScript *token_bucket_group_script(void);
extern void token_bucket_args(const BucketParams *params, int64 cost, const char **args);
extern bool bucket_params_init(BucketParams *params, int64 capacity,
							   int64 refill_amount, int64 refill_period_ms,
							   int64 idle_ttl_ms);
extern int64 bucket_refill_ms(const BucketParams *params);
extern void bucket_state_full(const BucketParams *params, BucketState *state, int64 now_ms);
extern void bucket_apply(const BucketParams *params, BucketState *state, int64 now_ms,
						 int64 cost, BucketMode mode, BucketResult *result);
extern bool bucket_is_full(const BucketParams *params, const BucketState *state, int64 now_ms);

#endif							/* RL_TOKEN_BUCKET_H */
