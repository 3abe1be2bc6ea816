/*
 * bucket.c
 *	  Token bucket arithmetic in C: turns a policy into the exact integer units
 *	  that lua/token_bucket.lua works in, and checks the bounds that keep it exact.
 */
#include "ratelimit.h"

#include "common/int.h"

#include "bucket.h"

/* Greatest common divisor of two positive integers. */
static int64
gcd64(int64 a, int64 b)
{
	while (b != 0)
	{
		int64		r = a % b;

		a = b;
		b = r;
	}
	return a;
}

/*
 * Fills params from a policy; idle_ttl_ms 0 means "time to refill completely".
 * Returns false when the policy is outside the exact bounds (the table's
 * rl_policy_exact_check constraint rejects such rows, so this is a safety net).
 */
bool
bucket_params_init(BucketParams *params, int64 capacity, int64 refill_amount,
				   int64 refill_period_ms, int64 idle_ttl_ms)
{
	int64		g;
	int64		capacity_units;

	if (capacity <= 0 || refill_amount <= 0 || refill_period_ms <= 0)
		return false;
	g = gcd64(refill_amount, refill_period_ms);
	params->capacity = capacity;
	params->unit = refill_period_ms / g;
	params->rate = refill_amount / g;
	if (pg_mul_s64_overflow(capacity, params->unit, &capacity_units) ||
		capacity_units >= BUCKET_EXACT_LIMIT - params->rate)
		return false;
	params->capacity_units = capacity_units;
	Assert(params->unit > 0 && params->rate > 0);
	params->ttl_ms = idle_ttl_ms > 0 ? idle_ttl_ms : bucket_refill_ms(params);
	return params->ttl_ms >= bucket_refill_ms(params);
}

/* Milliseconds an empty bucket needs to refill completely, rounded up. */
int64
bucket_refill_ms(const BucketParams *params)
{
	return (params->capacity_units + params->rate - 1) / params->rate;
}
