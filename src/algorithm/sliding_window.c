/*
 * sliding_window.c
 *	  The sliding window counter (Cloudflare's): windows of window_ms aligned
 *	  to the epoch each count in a key of their own, as fixed_window's do, and
 *	  a request at `elapsed` ms into window k sees
 *
 *	      count(k - 1) * (window - elapsed) / window + count(k)
 *
 *	  and is allowed when that plus its cost is at most the capacity. The
 *	  weighting assumes the previous window's requests were spread evenly: in
 *	  any window of window_ms it can grant more than the capacity, at most
 *	  twice (docs/algorithms.md measures it). All integers: the comparison is
 *	  multiplied out by window_ms (capacity * window_ms < 2^53). Keep
 *	  sliding_window_apply and lua/sliding_window/ step for step alike.
 */
#include "prelude.h"

#include "algorithm/sliding_window.h"
#include "algorithm/window.h"
#include "scripts.h"

static const LuaScript take_once_script = LUA_SCRIPT("sliding_window/take (once)", script_sliding_window_take_once);
static const LuaScript take_script = LUA_TAKE_SCRIPT("sliding_window/take", script_sliding_window_take, &take_once_script);
static const LuaScript peek_script_plain = LUA_SCRIPT("sliding_window/peek", script_sliding_window_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("sliding_window/peek", script_sliding_window_peek, &peek_script_plain);
static const LuaScript refund_script = LUA_SCRIPT("sliding_window/refund",
												  script_sliding_window_refund);

/*
 * The keys (this window's, the previous one's) and the 4 numbers of a check at
 * at_ms: capacity, cost, window, ms elapsed in it. (The script derives the
 * rest: with the clock and two keys, a call stays within the 10 arguments a
 * Redis that wants a password answers NOAUTH to.)
 */
static void
sliding_window_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
					LimitCall *part)
{
	LimitWindow window;

	window_at(params, at_ms, &window);
	part->keys[0] = window_key(key, 'w', window.start_ms);
	part->keys[1] = window_key(key, 'w', window.start_ms - params->window_ms);
	part->nkeys = 2;
	part->nargs = 4;
	part->args[0] = window_number(params->capacity);
	part->args[1] = window_number(cost);
	part->args[2] = window_number(params->window_ms);
	part->args[3] = window_number(at_ms - window.start_ms);
}

/* A refund goes back to the window of at_ms, its take's (KEYS[1]); the mark is KEYS[3]. */
static void
sliding_window_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
					int64 at_ms, const char *refund_mark, LimitCall *call)
{
	Assert(mode != LIMIT_SLICE);	/* limit_slices: never sliced */
	sliding_window_part(params, key, cost, at_ms, call);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script : &take_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

/* rl_reset forgets both windows the sliding window covers. */
static int
sliding_window_reset_keys(const LimitParams *params, const char *key, int64 at_ms,
						  const char **keys)
{
	LimitWindow window;

	window_at(params, at_ms, &window);
	keys[0] = window_key(key, 'w', window.start_ms);
	keys[1] = window_key(key, 'w', window.start_ms - params->window_ms);
	return 2;
}

static void
sliding_window_state_new(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	LimitWindow window;

	window_at(params, now_ms, &window);
	memset(state, 0, sizeof(*state));
	state->last_ms = window.start_ms;
}

/* The counts of the window starting at start and of the one before it, from state. */
static void
counts_at(const LimitParams *params, const SubjectState *state, int64 start,
		  int64 *current, int64 *previous)
{
	*current = 0;
	*previous = 0;
	if (state->last_ms >= start)
	{
		/* This window, or (a clock stepped back) a later one: counted there, denying more. */
		*current = state->level;
		*previous = state->previous;
	}
	else if (state->last_ms == start - params->window_ms)
		*previous = state->level;
}

/*
 * Decides cost at now_ms. A refund gives back to the window of now_ms (its
 * take's), in whichever count holds that window now.
 */
static void
sliding_window_apply(const LimitParams *params, SubjectState *state, int64 now_ms, int64 cost,
					 LimitMode mode, LimitResult *result)
{
	LimitWindow window;
	int64		w = params->window_ms;
	int64		capacity = params->capacity;
	int64		current;
	int64		previous;
	int64		elapsed;
	int64		left;
	int64		used;

	window_at(params, now_ms, &window);
	elapsed = now_ms - window.start_ms;
	left = window.end_ms - now_ms;
	if (mode == LIMIT_REFUND)
	{
		/* Only the count that holds the take's window gets it back. */
		if (state->last_ms == window.start_ms)
			state->level = Max(state->level - cost, 0);
		else if (state->last_ms == window.start_ms + w)
			state->previous = Max(state->previous - cost, 0);
		result->allowed = true;
		result->retry_after_ms = 0;
		counts_at(params, state, window.start_ms, &current, &previous);
	}
	else
	{
		counts_at(params, state, window.start_ms, &current, &previous);
		result->allowed = previous * (w - elapsed) + (current + cost) * w <= capacity * w;
		result->retry_after_ms = 0;
		if (result->allowed && mode == LIMIT_TAKE)
		{
			current += cost;
			state->level = current;
			state->previous = previous;
			state->last_ms = Max(state->last_ms, window.start_ms);
		}
		else if (!result->allowed)
		{
			int64		room = capacity - current - cost;

			if (room >= 0)
				/* Within this window, once the previous one weighs little enough. */
				result->retry_after_ms = w - (room * w) / previous - elapsed;
			else
				/* In the next window, where this one's count is the previous. */
				result->retry_after_ms = left + w - ((capacity - cost) * w) / current;
		}
	}
	used = previous * (w - elapsed) + current * w;
	result->remaining = used >= capacity * w ? 0 : (capacity * w - used) / w;
	result->reset_after_ms = current > 0 ? left + w : previous > 0 ? left : 0;
}

/* Counts of windows the sliding window no longer covers are forgotten at no loss. */
static bool
sliding_window_is_idle(const LimitParams *params, const SubjectState *state, int64 now_ms)
{
	LimitWindow window;
	int64		current;
	int64		previous;

	window_at(params, now_ms, &window);
	counts_at(params, state, window.start_ms, &current, &previous);
	return current == 0 && previous == 0;
}

static void
sliding_window_state_holding(const LimitParams *params, SubjectState *state, int64 now_ms,
							 int64 tokens)
{
	LimitWindow window;

	window_at(params, now_ms, &window);
	state->level = params->capacity - Min(tokens, params->capacity);
	state->previous = 0;
	state->last_ms = window.start_ms;
}

/* Two windows: this one's count weighs until the next one ends. */
static int64
sliding_window_full_ms(const LimitParams *params)
{
	return 2 * params->window_ms;
}

const LimitOps sliding_window_ops = {
	.tag = 4,
	.call = sliding_window_call,
	.group_part = sliding_window_part,
	.reset_keys = sliding_window_reset_keys,
	.state_new = sliding_window_state_new,
	.apply = sliding_window_apply,
	.is_idle = sliding_window_is_idle,
	.state_holding = sliding_window_state_holding,
	.full_ms = sliding_window_full_ms,
};
