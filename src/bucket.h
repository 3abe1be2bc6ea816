/*
 * bucket.h
 *	  Token bucket parameters in exact integer units, shared by the Lua script
 *	  and the C code.
 */
#ifndef RL_BUCKET_H
#define RL_BUCKET_H

/* Largest integer every value of the bucket math must stay below (Lua numbers are doubles). */
#define BUCKET_EXACT_LIMIT (INT64CONST(1) << 53)

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

extern bool bucket_params_init(BucketParams *params, int64 capacity,
							   int64 refill_amount, int64 refill_period_ms,
							   int64 idle_ttl_ms);
extern int64 bucket_refill_ms(const BucketParams *params);

#endif							/* RL_BUCKET_H */
