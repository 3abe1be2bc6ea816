/*
 * fixed_window.c
 *	  The fixed window: at most `capacity` tokens per window (window.c says
 *	  where windows start and end). Each window counts in a key of its own,
 *	  one integer that lives until the window ends; a new window starts at 0.
 *	  The window is chosen here and Redis is told how long it has left, so the
 *	  scripts need no clock: one INCRBY decides most calls. With rollover, a
 *	  window's limit is the capacity and what the previous window left unused,
 *	  at most `rollover` tokens, fixed at the window's first write (so its key
 *	  lives through the next window too). Keep fixed_window_apply and
 *	  lua/fixed_window/ step for step alike.
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
static const LuaScript carry_once_script = LUA_SCRIPT("fixed_window/take (once)",
													  script_fixed_window_take_once);
static const LuaScript carry_script = LUA_TAKE_SCRIPT("fixed_window/take", script_fixed_window_take,
													  &carry_once_script);
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

/*
 * How long the key of window lives: until it ends and a little more, at_ms
 * being the later of now and the call's time; with rollover, through the
 * next window too, whose first write reads what this one left unused.
 */
static int64
fixed_window_ttl(const LimitParams *params, const LimitWindow *window, int64 at_ms)
{
	int64		ttl = Max(window->end_ms - at_ms, 0) + WINDOW_KEY_MARGIN_MS;

	if (params->rollover > 0)
	{
		LimitWindow next;

		window_at(params, window->end_ms, &next);
		ttl += next.end_ms - next.start_ms;
	}
	return ttl;
}

/* The letter of a window's key: a window with rollover holds another value. */
static char
fixed_window_letter(const LimitParams *params)
{
	return params->rollover > 0 ? 'r' : 'w';
}

/*
 * Appends one window's key and 4 numbers (capacity, cost, ms left, TTL) to
 * part, as lua/fixed_window/common.lua reads them; with rollover, the
 * previous window's key and a 5th number, rollover (its ROLLOVER check). Its
 * time left and TTL count from from_ms (a refund's window may be older than
 * now: its key need not outlive it).
 */
static void
fixed_window_window(const LimitParams *params, const char *key, int64 cost, int64 window_ms,
					int64 from_ms, LimitCall *part)
{
	LimitWindow window;

	window_at(params, window_ms, &window);
	part->keys[part->nkeys++] = window_key(key, fixed_window_letter(params), window.start_ms);
	part->args[part->nargs++] = window_number(params->capacity);
	part->args[part->nargs++] = window_number(cost);
	part->args[part->nargs++] = window_number(Max(window.end_ms - from_ms, 0));
	part->args[part->nargs++] = window_number(fixed_window_ttl(params, &window, from_ms));
	if (params->rollover > 0)
	{
		LimitWindow previous;

		window_at(params, window.start_ms - 1, &previous);
		part->keys[part->nkeys++] = window_key(key, 'r', previous.start_ms);
		part->args[part->nargs++] = window_number(params->rollover);
		part->tag = FIXED_WINDOW_ROLLOVER_TAG;
	}
}

/* The keys and numbers of a check at at_ms (the group script's part). */
static void
fixed_window_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
				  LimitCall *part)
{
	part->nkeys = 0;
	part->nargs = 0;
	part->tag = 0;
	fixed_window_window(params, key, cost, at_ms, Max(at_ms, clock_now_ms()), part);
}

/* True when mode's script answers the window's limit: a peek or a take, with rollover. */
bool
fixed_window_answers_limit(const LimitParams *params, LimitMode mode)
{
	return params->rollover > 0 && (mode == LIMIT_PEEK || mode == LIMIT_TAKE);
}

/*
 * A call of mode's script; a refund goes to the window of at_ms (its take's);
 * a booking names the next window too (never with rollover: request.c). A
 * take without rollover is the lean take_one.lua.
 */
static void
fixed_window_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
				  int64 at_ms, const char *refund_mark, LimitCall *call)
{
	fixed_window_part(params, key, cost, at_ms, call);
	if (mode == LIMIT_BOOK)
	{
		LimitWindow window;

		Assert(params->rollover == 0);
		window_at(params, at_ms, &window);
		fixed_window_window(params, key, cost, window.end_ms, Max(at_ms, clock_now_ms()), call);
	}
	call->answers_limit = fixed_window_answers_limit(params, mode);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script :
		mode == LIMIT_SLICE ? &slice_script :
		mode == LIMIT_BOOK ? &book_script :
		mode == LIMIT_OWE ? &owe_script :
		params->rollover > 0 ? &carry_script : &take_script;
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
	keys[0] = window_key(key, fixed_window_letter(params), window.start_ms);
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
 * Decides cost at now_ms (the local fallback: its params carry nothing over,
 * rollover being Redis's alone). The count belongs to the window starting at
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
