/*
 * gcra.h
 *	  The generic cell rate algorithm: one integer per subject, the
 *	  theoretical arrival time. Its scripts are lua/gcra/.
 */
#ifndef RL_GCRA_H
#define RL_GCRA_H

#include "algorithm/limit.h"

/*
 * The arrival time is kept in units of 1/rate ms, so it grows rate times as
 * fast as the clock: rate (after the gcd) is bounded so that now * rate +
 * capacity_units stays below 2^53 until about the year 2249.
 */
#define GCRA_MAX_RATE 512
#define GCRA_MAX_CAPACITY_UNITS (INT64CONST(1) << 52)

extern const LimitOps gcra_ops;

extern bool gcra_params_init(LimitParams *params, int64 capacity, int64 refill_amount,
							 int64 refill_period_ms, int64 idle_ttl_ms);

#endif							/* RL_GCRA_H */
