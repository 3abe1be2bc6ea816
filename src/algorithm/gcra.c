/*
 * gcra.c
 *	  GCRA (the generic cell rate algorithm, as redis-cell's CL.THROTTLE runs
 *	  it with limit = capacity): each token is an emission interval of `unit`
 *	  units of time, where one millisecond is `rate` units (refill_amount /
 *	  refill_period reduced by their gcd, as for the token bucket); the burst
 *	  tolerance is capacity * unit. The one number stored is the theoretical
 *	  arrival time (TAT) in those units; a request of cost n is allowed when
 *	  max(TAT, now) + n * unit - now stays within the tolerance. Its answers
 *	  equal the token bucket's for the same parameters; what it saves is Redis
 *	  memory (one integer) and work. Keep gcra_apply and lua/gcra/ step for
 *	  step alike: a test runs the same (time, cost) sequence through both.
 */
#include "prelude.h"

#include "algorithm/gcra.h"
#include "algorithm/token_bucket.h"
#include "scripts.h"

static const LuaScript take_once_script = LUA_SCRIPT("gcra/take_one (once)", script_gcra_take_one_once);
static const LuaScript take_script = LUA_TAKE_SCRIPT("gcra/take_one", script_gcra_take_one,
													 &take_once_script);
static const LuaScript book_once_script = LUA_SCRIPT("gcra/book (once)", script_gcra_book_once);
static const LuaScript book_script = LUA_TAKE_SCRIPT("gcra/book", script_gcra_book, &book_once_script);
static const LuaScript owe_script = LUA_SCRIPT("gcra/owe", script_gcra_owe);
static const LuaScript peek_script_plain = LUA_SCRIPT("gcra/peek", script_gcra_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("gcra/peek", script_gcra_peek, &peek_script_plain);
static const LuaScript refund_script = LUA_SCRIPT("gcra/refund", script_gcra_refund);
static const LuaScript slice_script = LUA_SCRIPT("gcra/slice", script_gcra_slice);

/*
 * Fills params for GCRA: the token bucket's exact units, with the rate
 * bounded (GCRA_MAX_RATE) so that the arrival time stays exact. idle_ttl_ms 0:
 * each key lives until its arrival time, when it means nothing any more.
 */
bool
gcra_params_init(LimitParams *params, int64 capacity, int64 refill_amount,
				 int64 refill_period_ms, int64 idle_ttl_ms)
{
	bool		exact = bucket_params_init(params, capacity, refill_amount, refill_period_ms,
										   idle_ttl_ms);

	params->algorithm = ALGORITHM_GCRA;
	params->ttl_ms = idle_ttl_ms;
	return exact && params->rate <= GCRA_MAX_RATE &&
		params->capacity_units < GCRA_MAX_CAPACITY_UNITS;
}

/* a / b rounded up, for a >= 0 and b > 0. */
static int64
ceil_div(int64 a, int64 b)
{
	return a / b + (a % b != 0);
}

/* The scripts take the token bucket's numbers: tolerance, rate, unit, cost, TTL (0: own). */
static void
gcra_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
		  int64 at_ms, const char *refund_mark, LimitCall *call)
{
	token_bucket_group_part(params, key, cost, at_ms, call);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script :
		mode == LIMIT_SLICE ? &slice_script :
		mode == LIMIT_BOOK ? &book_script :
		mode == LIMIT_OWE ? &owe_script : &take_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

/* No arrival time yet: anything at or before now means the same. */
static void
gcra_state_new(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	memset(state, 0, sizeof(*state));
}

/*
 * Decides cost at now_ms (take, peek or refund) and answers as the token
 * bucket does: remaining whole tokens, the wait for this cost, the time until
 * the arrival time is reached (the bucket is full again). A clock that steps
 * back leaves the arrival time where it is, so the wait grows by the step.
 */
static void
gcra_apply(const LimitParams *params, SubjectState *state, int64 now_ms, int64 cost,
		   LimitMode mode, LimitResult *result)
{
	int64		now = now_ms * params->rate;
	int64		tolerance = params->capacity_units;
	int64		need = cost * params->unit;
	int64		tat = Max(state->level, now);

	result->allowed = true;
	result->retry_after_ms = 0;
	if (mode == LIMIT_REFUND)
		tat = Max(tat - need, now);
	else if (tat + need - now <= tolerance)
	{
		if (mode == LIMIT_TAKE)
			tat += need;
	}
	else
	{
		result->allowed = false;
		result->retry_after_ms = ceil_div(tat + need - tolerance - now, params->rate);
	}
	if (result->allowed && mode != LIMIT_PEEK)
		state->level = tat;
	result->remaining = tat - now >= tolerance ? 0 : (tolerance - (tat - now)) / params->unit;
	result->reset_after_ms = ceil_div(tat - now, params->rate);
}

/* Forgetting a subject whose arrival time has passed loses nothing. */
static bool
gcra_is_idle(const LimitParams *params, const SubjectState *state, int64 now_ms)
{
	return state->level <= now_ms * params->rate;
}

/* The arrival time at which tokens (at most capacity) are left. */
static void
gcra_state_holding(const LimitParams *params, SubjectState *state, int64 now_ms, int64 tokens)
{
	state->level = now_ms * params->rate +
		(params->capacity - Min(tokens, params->capacity)) * params->unit;
}

const LimitOps gcra_ops = {
	.tag = 2,
	.call = gcra_call,
	.group_part = token_bucket_group_part,
	.reset_keys = token_bucket_reset_keys,
	.state_new = gcra_state_new,
	.apply = gcra_apply,
	.is_idle = gcra_is_idle,
	.state_holding = gcra_state_holding,
	.full_ms = bucket_refill_ms,
};
