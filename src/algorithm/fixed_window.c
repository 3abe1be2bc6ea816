/*
 * fixed_window.c
 *	  The fixed window: at most `capacity` tokens per window (window.c says
 *	  where windows start and end). Each window counts in a key of its own,
 *	  one integer that lives until the window ends; a new window starts at 0.
 *	  The window is chosen here and Redis is told how long it has left, so the
 *	  scripts need no clock: one INCRBY decides most calls. Keep
 *	  fixed_window_apply and lua/fixed_window/ step for step alike.
 */
#include "prelude.h"

#include "algorithm/fixed_window.h"
#include "base/clock.h"
#include "algorithm/window.h"
#include "scripts.h"

static const LuaScript take_once_script = LUA_SCRIPT("fixed_window/take_one (once)",
													 script_fixed_window_take_one_once);
static const LuaScript take_script = LUA_TAKE_SCRIPT("fixed_window/take_one",
													 script_fixed_window_take_one, &take_once_script);
static const LuaScript book_once_script = LUA_SCRIPT("fixed_window/book (once)",
													 script_fixed_window_book_once);
static const LuaScript book_script = LUA_TAKE_SCRIPT("fixed_window/book", script_fixed_window_book,
													 &book_once_script);
static const LuaScript owe_script = LUA_SCRIPT("fixed_window/owe", script_fixed_window_owe);
static const LuaScript peek_script_plain = LUA_SCRIPT("fixed_window/peek", script_fixed_window_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("fixed_window/peek", script_fixed_window_peek, &peek_script_plain);
static const LuaScript refund_script = LUA_SCRIPT("fixed_window/refund",
												  script_fixed_window_refund);
static const LuaScript slice_script = LUA_SCRIPT("fixed_window/slice", script_fixed_window_slice);

/* The key and the 4 numbers of a check at at_ms: capacity, cost, ms left in the window, TTL. */
static void
fixed_window_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
				  LimitCall *part)
{
	LimitWindow window;
	int64		left;

	window_at(params, at_ms, &window);
	/* A refund's window may be older than now: its key need not outlive it. */
	left = Max(window.end_ms - Max(at_ms, clock_now_ms()), 0);
	part->keys[0] = window_key(key, window.start_ms);
	part->nkeys = 1;
	part->nargs = 4;
	part->args[0] = window_number(params->capacity);
	part->args[1] = window_number(cost);
	part->args[2] = window_number(left);
	part->args[3] = window_number(left + WINDOW_KEY_MARGIN_MS);
}

/*
 * A booking's second window, after the part of the window of at_ms: the next
 * window's key and 4 numbers, its time left counted from now, as its key's TTL.
 */
static void
fixed_window_next_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
					   LimitCall *call)
{
	LimitWindow window;
	LimitWindow next;
	int64		left;

	window_at(params, at_ms, &window);
	window_at(params, window.end_ms, &next);
	left = Max(next.end_ms - Max(at_ms, clock_now_ms()), 0);
	call->keys[call->nkeys++] = window_key(key, next.start_ms);
	call->args[call->nargs++] = window_number(params->capacity);
	call->args[call->nargs++] = window_number(cost);
	call->args[call->nargs++] = window_number(left);
	call->args[call->nargs++] = window_number(left + WINDOW_KEY_MARGIN_MS);
}

/*
 * A call of mode's script; a refund goes to the window of at_ms (its take's);
 * a booking names the next window too.
 */
static void
fixed_window_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
				  int64 at_ms, const char *refund_mark, LimitCall *call)
{
	fixed_window_part(params, key, cost, at_ms, call);
	if (mode == LIMIT_BOOK)
		fixed_window_next_part(params, key, cost, at_ms, call);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script :
		mode == LIMIT_SLICE ? &slice_script :
		mode == LIMIT_BOOK ? &book_script :
		mode == LIMIT_OWE ? &owe_script : &take_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

/* rl_reset forgets the window now counting. */
static int
fixed_window_reset_keys(const LimitParams *params, const char *key, int64 at_ms,
						const char **keys)
{
	LimitWindow window;

	window_at(params, at_ms, &window);
	keys[0] = window_key(key, window.start_ms);
	return 1;
}

static void
fixed_window_state_new(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	LimitWindow window;

	window_at(params, now_ms, &window);
	memset(state, 0, sizeof(*state));
	state->last_ms = window.start_ms;
}

/*
 * Decides cost at now_ms. The count belongs to the window starting at
 * last_ms: a later window starts at 0. One slot holds one window, so a clock
 * that steps back into an earlier window keeps counting in the later one
 * (denying more, never granting more; Redis would count in the earlier
 * window's own key). A refund with now_ms in an earlier window than the
 * count's gives nothing back: its window is over.
 */
static void
fixed_window_apply(const LimitParams *params, SubjectState *state, int64 now_ms, int64 cost,
				   LimitMode mode, LimitResult *result)
{
	LimitWindow window;
	int64		count;
	int64		left;

	window_at(params, now_ms, &window);
	left = window.end_ms - now_ms;
	count = state->last_ms >= window.start_ms ? state->level : 0;
	result->allowed = true;
	result->retry_after_ms = 0;
	if (mode == LIMIT_REFUND)
		count = state->last_ms == window.start_ms ? Max(count - cost, 0) : count;
	else if (count + cost <= params->capacity)
	{
		if (mode == LIMIT_TAKE)
			count += cost;
	}
	else
	{
		result->allowed = false;
		result->retry_after_ms = left;
	}
	if (result->allowed && mode != LIMIT_PEEK)
	{
		state->level = count;
		state->last_ms = Max(state->last_ms, window.start_ms);
	}
	result->remaining = Max(params->capacity - count, 0);
	result->reset_after_ms = count > 0 ? left : 0;
}

/* A count of an earlier window, or of none, is forgotten at no loss. */
static bool
fixed_window_is_idle(const LimitParams *params, const SubjectState *state, int64 now_ms)
{
	LimitWindow window;

	window_at(params, now_ms, &window);
	return state->level == 0 || state->last_ms < window.start_ms;
}

static void
fixed_window_state_holding(const LimitParams *params, SubjectState *state, int64 now_ms,
						   int64 tokens)
{
	LimitWindow window;

	window_at(params, now_ms, &window);
	state->level = params->capacity - Min(tokens, params->capacity);
	state->last_ms = window.start_ms;
}

/* The window now counting (a calendar month: this one). */
static int64
fixed_window_full_ms(const LimitParams *params)
{
	LimitWindow window;

	window_at(params, clock_now_ms(), &window);
	return window.end_ms - window.start_ms;
}

const LimitOps fixed_window_ops = {
	.tag = 3,
	.call = fixed_window_call,
	.group_part = fixed_window_part,
	.reset_keys = fixed_window_reset_keys,
	.state_new = fixed_window_state_new,
	.apply = fixed_window_apply,
	.is_idle = fixed_window_is_idle,
	.state_holding = fixed_window_state_holding,
	.full_ms = fixed_window_full_ms,
};
