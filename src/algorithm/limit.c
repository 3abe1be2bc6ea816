/*
 * limit.c
 *	  The algorithms side by side: their names, the parameters a policy row
 *	  gives each (and the bounds that keep them exact), and the dispatch to
 *	  each one's C model and scripts. The group script (rl_consume_all)
 *	  decides checks of every algorithm in one atomic step; a slice's
 *	  give-back and rl_reset are calls of every algorithm too.
 */
#include "prelude.h"

#include "algorithm/fixed_window.h"
#include "algorithm/gcra.h"
#include "algorithm/sliding_log.h"
#include "algorithm/sliding_window.h"
#include "algorithm/token_bucket.h"
#include "algorithm/window.h"
#include "scripts.h"

static const LuaScript group_once_script = LUA_SCRIPT("group (once)", script_group_once);
static const LuaScript group_script = LUA_TAKE_SCRIPT("group", script_group, &group_once_script);
/* Forgets a bucket (or a lease set), whatever the algorithm. */
static const LuaScript reset_script = LUA_SCRIPT("reset", script_reset);

/* The algorithm column's values, as the table's constraint allows them. */
static const char *const names[] = {
	[ALGORITHM_TOKEN_BUCKET] = "token_bucket",
	[ALGORITHM_CONCURRENCY] = "concurrency",
	[ALGORITHM_GCRA] = "gcra",
	[ALGORITHM_FIXED_WINDOW] = "fixed_window",
	[ALGORITHM_SLIDING_WINDOW] = "sliding_window",
	[ALGORITHM_SLIDING_LOG] = "sliding_log",
};

/* The algorithm named so (the table allows no others: unknown reads as a token bucket). */
Algorithm
limit_algorithm(const char *name)
{
	for (int i = 0; i < (int) lengthof(names); i++)
		if (strcmp(names[i], name) == 0)
			return (Algorithm) i;
	return ALGORITHM_TOKEN_BUCKET;
}

const char *
limit_algorithm_name(Algorithm algorithm)
{
	return names[algorithm];
}

/* True for the algorithms that refill continuously (refill_amount per refill_period). */
bool
limit_refills(Algorithm algorithm)
{
	return algorithm == ALGORITHM_TOKEN_BUCKET || algorithm == ALGORITHM_GCRA;
}

/*
 * True for the algorithms an allowance may slice: a slice's tokens are spent
 * after they were taken, which the refilling algorithms and the fixed window
 * (a slice lives no longer than its window) count exactly; the sliding
 * algorithms weigh each token by when it was taken, and would count a
 * slice's late ones early.
 */
bool
limit_slices(Algorithm algorithm)
{
	return limit_refills(algorithm) || algorithm == ALGORITHM_FIXED_WINDOW;
}

/*
 * True for an algorithm whose take may book a wait (LIMIT_BOOK) or owe
 * (LIMIT_OWE): refilling ones book refill still to come, a fixed window the
 * next window. A sliding window or log has no later time that is its own.
 */
bool
limit_books(Algorithm algorithm)
{
	return limit_refills(algorithm) || algorithm == ALGORITHM_FIXED_WINDOW;
}

/*
 * The time a take asked at at_ms and booked ahead counts at: a fixed window's
 * booking is in the window after the one of at_ms, so its give-back, its
 * rollback and its settle go there; a refilling algorithm's at its own time.
 */
int64
limit_booked_at_ms(const LimitParams *params, int64 at_ms)
{
	LimitWindow window;

	if (params->algorithm != ALGORITHM_FIXED_WINDOW)
		return at_ms;
	window_at(params, at_ms, &window);
	return window.end_ms;
}

/*
 * Fills params from a policy row's limits: capacity, and a refill (refilling
 * algorithms) or a window (window algorithms: period, no refill_amount).
 * idle_ttl_ms 0 means the algorithm's own TTL. Returns false when the row is
 * outside the bounds that keep the scripts exact (the table's constraints
 * reject such rows: this is a safety net).
 */
bool
limit_params_init(LimitParams *params, Algorithm algorithm, int64 capacity,
				  int64 refill_amount, const Interval *period, int64 idle_ttl_ms,
				  const char *time_zone)
{
	int64		period_ms = 0;

	memset(params, 0, sizeof(*params));
	if (period != NULL && period->month == 0)
		period_ms = (int64) period->day * SECS_PER_DAY * 1000 + period->time / 1000;
	switch (algorithm)
	{
		case ALGORITHM_TOKEN_BUCKET:
			return bucket_params_init(params, capacity, refill_amount, period_ms, idle_ttl_ms);
		case ALGORITHM_GCRA:
			return gcra_params_init(params, capacity, refill_amount, period_ms, idle_ttl_ms);
		case ALGORITHM_CONCURRENCY:
			params->algorithm = algorithm;
			params->capacity = capacity;
			params->ttl_ms = idle_ttl_ms;
			return capacity > 0 && capacity < BUCKET_EXACT_LIMIT &&
				idle_ttl_ms > 0 && idle_ttl_ms <= BUCKET_MAX_TTL_MS;
		case ALGORITHM_FIXED_WINDOW:
		case ALGORITHM_SLIDING_WINDOW:
		case ALGORITHM_SLIDING_LOG:
			break;
	}
	params->algorithm = algorithm;
	params->capacity = capacity;
	if (period == NULL || capacity <= 0 || capacity >= BUCKET_EXACT_LIMIT)
		return false;
	if (algorithm == ALGORITHM_FIXED_WINDOW)
	{
		params->calendar = window_calendar(period->month, period->day, period->time);
		strlcpy(params->time_zone, time_zone != NULL ? time_zone : "UTC", LIMIT_ZONE_LEN);
		if (params->calendar != CALENDAR_NONE)
			return true;
	}
	params->window_ms = period_ms;
	if (period->month != 0 || period_ms <= 0 || period_ms > BUCKET_MAX_TTL_MS)
		return false;
	if (algorithm == ALGORITHM_SLIDING_WINDOW)
		return capacity <= (BUCKET_EXACT_LIMIT / 4 - 1) / period_ms;
	if (algorithm == ALGORITHM_SLIDING_LOG)
		return capacity <= SLIDING_LOG_MAX_CAPACITY;
	return true;
}

/* True when a call of params' script in mode answers its limit 5th (fixed_window.c). */
bool
limit_answers_limit(const LimitParams *params, LimitMode mode)
{
	return params->algorithm == ALGORITHM_FIXED_WINDOW && fixed_window_answers_limit(params, mode);
}

/* The C model and scripts of params' algorithm. */
const LimitOps *
limit_ops(const LimitParams *params)
{
	switch (params->algorithm)
	{
		case ALGORITHM_GCRA:
			return &gcra_ops;
		case ALGORITHM_FIXED_WINDOW:
			return &fixed_window_ops;
		case ALGORITHM_SLIDING_WINDOW:
			return &sliding_window_ops;
		case ALGORITHM_SLIDING_LOG:
			return &sliding_log_ops;
		case ALGORITHM_TOKEN_BUCKET:
		case ALGORITHM_CONCURRENCY:
			break;
	}
	Assert(params->algorithm == ALGORITHM_TOKEN_BUCKET);
	return &token_bucket_ops;
}

/*
 * The group script: KEYS every check's keys, ARGV the clock then, per check,
 * its algorithm's tag (LimitOps.tag) and its numbers; all granted or none
 * charged, 4 numbers answered per check.
 */
const LuaScript *
limit_group_script(void)
{
	return &group_script;
}

/*
 * The call that gives tokens taken at taken_ms and not granted (what a
 * slice held) back to the bucket at key, or to the window they counted in.
 */
void
limit_give_back_call(const LimitParams *params, const char *key, int64 tokens, int64 taken_ms,
					 LimitCall *call)
{
	limit_ops(params)->call(params, LIMIT_REFUND, key, tokens, taken_ms, NULL, call);
}

/* rl_reset's call: the reset script on every key of the subject at key (no numbers). */
void
limit_reset_call(const LimitParams *params, const char *key, int64 at_ms, LimitCall *call)
{
	memset(call, 0, sizeof(*call));
	call->script = &reset_script;
	call->nkeys = limit_ops(params)->reset_keys(params, key, at_ms, call->keys);
}
