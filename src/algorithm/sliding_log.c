/*
 * sliding_log.c
 *	  The sliding log: one sorted set per subject holds a member per granted
 *	  request, scored by its time on Redis's clock and carrying the tokens the
 *	  log granted up to it (lua/sliding_log/common.lua); a request is allowed
 *	  when the tokens granted within the last window, plus its cost, are at
 *	  most the capacity. Exact for any window, each script a few commands of
 *	  O(log N) at every capacity the table accepts (SLIDING_LOG_MAX_CAPACITY).
 *
 *	  In C (the local fallback) a log of at most LIMIT_LOG_TOKENS tokens is
 *	  kept in the slot, a time per token, deciding step for step as the
 *	  scripts do (a test runs one sequence through both). A longer log does not
 *	  fit a slot of fixed size, so its local fallback (policy.c) is a fixed
 *	  window of the same length holding half the local capacity: any window of
 *	  that length overlaps at most two fixed ones, so it never grants more than
 *	  the log.
 */
#include "prelude.h"

#include "algorithm/sliding_log.h"
#include "algorithm/window.h"
#include "scripts.h"

static const LuaScript take_once_script = LUA_SCRIPT("sliding_log/take (once)", script_sliding_log_take_once);
static const LuaScript take_script = LUA_TAKE_SCRIPT("sliding_log/take", script_sliding_log_take, &take_once_script);
static const LuaScript peek_script_plain = LUA_SCRIPT("sliding_log/peek", script_sliding_log_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("sliding_log/peek", script_sliding_log_peek, &peek_script_plain);
static const LuaScript refund_script = LUA_SCRIPT("sliding_log/refund", script_sliding_log_refund);

/* The log's key and its 3 numbers: capacity, cost, window. */
static void
sliding_log_part(const LimitParams *params, const char *key, int64 cost, int64 at_ms,
				 LimitCall *part)
{
	part->keys[0] = key;
	part->nkeys = 1;
	part->nargs = 3;
	part->args[0] = window_number(params->capacity);
	part->args[1] = window_number(cost);
	part->args[2] = window_number(params->window_ms);
}

static void
sliding_log_call(const LimitParams *params, LimitMode mode, const char *key, int64 cost,
				 int64 at_ms, const char *refund_mark, LimitCall *call)
{
	Assert(mode != LIMIT_SLICE);	/* limit_slices: never sliced */
	sliding_log_part(params, key, cost, at_ms, call);
	call->script = mode == LIMIT_PEEK ? &peek_script :
		mode == LIMIT_REFUND ? &refund_script : &take_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

static int
sliding_log_reset_keys(const LimitParams *params, const char *key, int64 at_ms,
					   const char **keys)
{
	keys[0] = key;
	return 1;
}

/* A full window. */
static int64
sliding_log_full_ms(const LimitParams *params)
{
	return params->window_ms;
}

static void
sliding_log_state_new(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	memset(state, 0, sizeof(*state));
}

/* Drops the entries no younger than the window: those at or before now - window. */
static void
log_trim(const LimitParams *params, SubjectState *state, int64 now_ms)
{
	int			old = 0;

	while (old < state->level && state->log[old] <= now_ms - params->window_ms)
		old++;
	memmove(state->log, state->log + old, (state->level - old) * sizeof(int64));
	state->level -= old;
}

/*
 * Adds count entries at now_ms, or at the newest entry's time if later: after
 * a clock stepped back, new entries leave the window later, never sooner.
 */
static void
log_add(SubjectState *state, int64 now_ms, int64 count)
{
	int64		at_ms = now_ms;

	if (state->level > 0)
		at_ms = Max(at_ms, state->log[state->level - 1]);
	for (int i = 0; i < count; i++)
		state->log[state->level + i] = at_ms;
	state->level += count;
}

/*
 * Decides cost at now_ms as lua/sliding_log/ does: allowed when the entries
 * younger than the window plus cost are at most the capacity (at most
 * LIMIT_LOG_TOKENS); a denial waits for the oldest entries in the way; a
 * refund takes out the oldest.
 */
static void
sliding_log_apply(const LimitParams *params, SubjectState *state, int64 now_ms, int64 cost,
				  LimitMode mode, LimitResult *result)
{
	SubjectState log = *state;
	int64		held;

	Assert(params->capacity <= LIMIT_LOG_TOKENS);
	log_trim(params, &log, now_ms);
	result->allowed = true;
	result->retry_after_ms = 0;
	if (mode == LIMIT_REFUND)
	{
		/* The oldest in the window go: the log never counts too few in a window to come. */
		int64		removed = Min(cost, log.level);

		memmove(log.log, log.log + removed, (log.level - removed) * sizeof(int64));
		log.level -= removed;
	}
	else if (log.level + cost <= params->capacity)
	{
		if (mode == LIMIT_TAKE)
			log_add(&log, now_ms, cost);
	}
	else
	{
		result->allowed = false;
		result->retry_after_ms = log.log[log.level + cost - params->capacity - 1] +
			params->window_ms - now_ms;
	}
	if (result->allowed && mode != LIMIT_PEEK)
		*state = log;
	held = log.level;
	result->remaining = Max(params->capacity - held, 0);
	result->reset_after_ms = held > 0 ? log.log[held - 1] + params->window_ms - now_ms : 0;
}

/* A log with no entry in the window is forgotten at no loss. */
static bool
sliding_log_is_idle(const LimitParams *params, const SubjectState *state, int64 now_ms)
{
	return state->level == 0 ||
		state->log[state->level - 1] <= now_ms - params->window_ms;
}

/* A log holding tokens: the entries used, all at now (the most a new log could count). */
static void
sliding_log_state_holding(const LimitParams *params, SubjectState *state, int64 now_ms,
						  int64 tokens)
{
	memset(state, 0, sizeof(*state));
	log_add(state, now_ms, params->capacity - Min(tokens, params->capacity));
}

/*
 * Redis keeps logs of up to SLIDING_LOG_MAX_CAPACITY tokens; the C model holds
 * at most LIMIT_LOG_TOKENS (a longer one's local fallback is a fixed window).
 */
const LimitOps sliding_log_ops = {
	.tag = 5,
	.call = sliding_log_call,
	.group_part = sliding_log_part,
	.reset_keys = sliding_log_reset_keys,
	.state_new = sliding_log_state_new,
	.apply = sliding_log_apply,
	.is_idle = sliding_log_is_idle,
	.state_holding = sliding_log_state_holding,
	.full_ms = sliding_log_full_ms,
};
