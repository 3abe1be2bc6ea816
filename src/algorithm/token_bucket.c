/*
 * token_bucket.c
 *	  The token bucket: its scripts in Redis (lua/token_bucket/, one per mode)
 *	  and the numbers they take, and the same arithmetic in C. It turns a
 *	  policy into the exact integer units the scripts work in, checks the
 *	  bounds that keep it exact, and makes the scripts' decision for buckets
 *	  kept in PostgreSQL (the local fallback). Keep bucket_apply and the
 *	  scripts step for step alike: a test feeds both the same (time, cost)
 *	  sequence and compares every answer.
 */
#include "prelude.h"

#include "common/int.h"

#include "algorithm/token_bucket.h"
#include "scripts.h"

static const LuaScript take_once_script = LUA_SCRIPT("token_bucket/take_one (once)",
													 script_token_bucket_take_one_once);
static const LuaScript take_one_script = LUA_TAKE_SCRIPT("token_bucket/take_one",
														 script_token_bucket_take_one,
														 &take_once_script);
static const LuaScript book_once_script = LUA_SCRIPT("token_bucket/book (once)",
													 script_token_bucket_book_once);
static const LuaScript book_script = LUA_TAKE_SCRIPT("token_bucket/book", script_token_bucket_book,
													 &book_once_script);
static const LuaScript owe_script = LUA_SCRIPT("token_bucket/owe", script_token_bucket_owe);
static const LuaScript peek_script_plain = LUA_SCRIPT("token_bucket/peek", script_token_bucket_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("token_bucket/peek", script_token_bucket_peek, &peek_script_plain);
static const LuaScript refund_script = LUA_SCRIPT("token_bucket/refund", script_token_bucket_refund);
static const LuaScript slice_script = LUA_SCRIPT("token_bucket/slice", script_token_bucket_slice);

/* One bucket of a group: its key and TOKEN_BUCKET_ARGS numbers (GCRA's too). */
void
token_bucket_group_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
						LimitCall *part)
{
	part->keys[0] = key;
	part->nkeys = 1;
	part->nargs = TOKEN_BUCKET_ARGS;
	token_bucket_args(params, cost, part->args);
}

/*
 * A call of mode's script on one bucket: KEYS the bucket (for a refund also
 * an optional mark that makes it happen once), ARGV (after the clock)
 * TOKEN_BUCKET_ARGS numbers; each answers 4 numbers (LimitResult). A take
 * goes to take_one, the lean path: Redis's own time per decision is what
 * every server sharing it pays.
 */
static void
token_bucket_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
				  int64 at_ms, const char *refund_mark, LimitCall *call)
{
	token_bucket_group_part(params, key, cost, at_ms, call);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script :
		mode == LIMIT_SLICE ? &slice_script :
		mode == LIMIT_BOOK ? &book_script :
		mode == LIMIT_OWE ? &owe_script : &take_one_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

/* A bucket is one key (so is GCRA's arrival time). */
int
token_bucket_reset_keys(const LimitParams *params, const char *key, int64 at_ms,
						const char **keys)
{
	keys[0] = key;
	return 1;
}

/*
 * The TOKEN_BUCKET_ARGS numbers of one bucket for its script: capacity in
 * units, rate, unit, cost (a refund's amount) in tokens, TTL; printed in the
 * current memory context.
 */
void
token_bucket_args(const LimitParams *params, int64 cost, const char **args)
{
	args[0] = psprintf(INT64_FORMAT, params->capacity_units);
	args[1] = psprintf(INT64_FORMAT, params->rate);
	args[2] = psprintf(INT64_FORMAT, params->unit);
	args[3] = psprintf(INT64_FORMAT, cost);
	args[4] = psprintf(INT64_FORMAT, params->ttl_ms);
}

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
bucket_params_init(LimitParams *params, int64 capacity, int64 refill_amount,
				   int64 refill_period_ms, int64 idle_ttl_ms)
{
	int64		g;
	int64		capacity_units;

	if (capacity <= 0 || refill_amount <= 0 || refill_period_ms <= 0 ||
		idle_ttl_ms > BUCKET_MAX_TTL_MS)
		return false;
	g = gcd64(refill_amount, refill_period_ms);
	params->algorithm = ALGORITHM_TOKEN_BUCKET;
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
bucket_refill_ms(const LimitParams *params)
{
	return (params->capacity_units + params->rate - 1) / params->rate;
}

/* a / b rounded down, for a >= 0 and b > 0. */
static int64
floor_div(int64 a, int64 b)
{
	return a / b;
}

/* a / b rounded up, for a >= 0 and b > 0. */
static int64
ceil_div(int64 a, int64 b)
{
	return (a + b - 1) / b;
}

/* a + b, saturating where the script's doubles stop being exact. */
static int64
add_saturating(int64 a, int64 b)
{
	int64		sum;

	if (pg_add_s64_overflow(a, b, &sum) || sum > BUCKET_EXACT_LIMIT - 1)
		return BUCKET_EXACT_LIMIT - 1;
	return sum;
}

/*
 * Gives need units back to a bucket written ahead of now (last > now: its
 * level at last), counting what it owes at now_ms, as the scripts do
 * (lua/token_bucket/common.lua): a booking given back is a turn for whoever
 * comes next, never tokens ahead of their time.
 */
static void
bucket_give_back_owing(const LimitParams *params, int64 need, int64 now_ms, int64 *level,
					   int64 *last, int64 *paused)
{
	int64		owed;
	int64		now_level;
	int64		ahead;

	if (pg_mul_s64_overflow(*paused, params->rate, &owed))
		owed = BUCKET_EXACT_LIMIT;
	now_level = Min(params->capacity_units, *level - Min(owed, BUCKET_EXACT_LIMIT) + need);
	if (now_level >= 0)
	{
		*level = now_level;
		*last = now_ms;
		*paused = 0;
		return;
	}
	ahead = ceil_div(-now_level, params->rate);
	*level = now_level + ahead * params->rate;
	*last = now_ms + ahead;
	*paused = ahead;
}

/* A new bucket: full, as a missing Redis key is. */
static void
bucket_state_full(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	state->level = params->capacity_units;
	state->last_ms = now_ms;
}

/*
 * Refills state to now_ms, then takes cost tokens if they are all there (or,
 * by mode, only looks, or gives cost tokens back). A denial or a peek leaves
 * state as it was (the script writes nothing either).
 */
void
bucket_apply(const LimitParams *params, SubjectState *state, int64 now_ms,
			 int64 cost, LimitMode mode, LimitResult *result)
{
	int64		capacity = params->capacity_units;
	int64		need = cost * params->unit;
	int64		level = Min(state->level, capacity);
	int64		last = state->last_ms;
	int64		paused = 0;

	Assert(params->algorithm == ALGORITHM_TOKEN_BUCKET);

	/* A clock that steps back adds nothing and does not move `last` back. */
	if (now_ms > last)
	{
		int64		elapsed = now_ms - last;

		if (elapsed >= ceil_div(capacity - level, params->rate))
			level = capacity;
		else
			level += elapsed * params->rate;
		last = now_ms;
	}
	else
		paused = last - now_ms;

	result->allowed = mode == LIMIT_REFUND || level >= need;
	result->retry_after_ms = 0;
	if (mode == LIMIT_REFUND && paused > 0)
		bucket_give_back_owing(params, need, now_ms, &level, &last, &paused);
	else if (mode == LIMIT_REFUND)
		level = Min(capacity, level + need);
	else if (result->allowed && mode == LIMIT_TAKE)
		level -= need;
	else if (!result->allowed)
		result->retry_after_ms = add_saturating(paused, ceil_div(need - level, params->rate));
	if (result->allowed && mode != LIMIT_PEEK)
	{
		state->level = level;
		state->last_ms = last;
	}
	result->remaining = floor_div(level, params->unit);
	result->reset_after_ms = level < capacity ?
		add_saturating(paused, ceil_div(capacity - level, params->rate)) : 0;
}

/* True when the bucket has refilled completely by now_ms: forgetting it loses nothing. */
static bool
bucket_is_full(const LimitParams *params, const SubjectState *state, int64 now_ms)
{
	return now_ms >= state->last_ms &&
		now_ms - state->last_ms >= ceil_div(params->capacity_units - Min(state->level, params->capacity_units),
											params->rate);
}

/* A bucket holding tokens (at most its capacity) at now_ms. */
static void
bucket_state_holding(const LimitParams *params, SubjectState *state, int64 now_ms, int64 tokens)
{
	state->level = Min(tokens, params->capacity) * params->unit;
	state->last_ms = Max(state->last_ms, now_ms);
}

const LimitOps token_bucket_ops = {
	.tag = 1,
	.call = token_bucket_call,
	.group_part = token_bucket_group_part,
	.reset_keys = token_bucket_reset_keys,
	.state_new = bucket_state_full,
	.apply = bucket_apply,
	.is_idle = bucket_is_full,
	.state_holding = bucket_state_holding,
	.full_ms = bucket_refill_ms,
};
