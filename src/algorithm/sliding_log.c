/*
 * sliding_log.c
 *	  The sliding log: one sorted set per subject holds a timestamp per token
 *	  granted within the last window (on Redis's clock, as the token bucket's
 *	  refill); a request is allowed when the entries younger than the window,
 *	  plus its cost, are at most the capacity. Exact for any window, at the
 *	  price of memory per token: capacity is bounded (SLIDING_LOG_MAX_CAPACITY).
 *
 *	  A log does not fit a slot of fixed size in shared memory, so its local
 *	  fallback (policy.c) is a fixed window of the same length holding half
 *	  the local capacity: any window of that length overlaps at most two fixed
 *	  ones, so the fallback never grants more than the log would allow.
 */
#include "prelude.h"

#include "algorithm/sliding_log.h"
#include "algorithm/window.h"
#include "scripts.h"

static const LuaScript take_script = LUA_SCRIPT("sliding_log/take", script_sliding_log_take);
static const LuaScript peek_script = LUA_SCRIPT("sliding_log/peek", script_sliding_log_peek);
static const LuaScript refund_script = LUA_SCRIPT("sliding_log/refund", script_sliding_log_refund);

/* The log's key and its 3 numbers: capacity, cost, window. */
static void
sliding_log_part(const BucketParams *params, const char *key, int64 cost, int64 at_ms,
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
sliding_log_call(const BucketParams *params, BucketMode mode, const char *key, int64 cost,
				 int64 at_ms, const char *refund_mark, LimitCall *call)
{
	sliding_log_part(params, key, cost, at_ms, call);
	call->script = mode == BUCKET_PEEK ? &peek_script :
		mode == BUCKET_REFUND ? &refund_script : &take_script;
	if (refund_mark != NULL)
		call->keys[call->nkeys++] = refund_mark;
}

static int
sliding_log_reset_keys(const BucketParams *params, const char *key, int64 at_ms,
					   const char **keys)
{
	keys[0] = key;
	return 1;
}

/* A full window. */
static int64
sliding_log_full_ms(const BucketParams *params)
{
	return params->window_ms;
}

/* Only Redis keeps logs: the local fallback is a fixed window (see above). */
const LimitOps sliding_log_ops = {
	.tag = 5,
	.call = sliding_log_call,
	.group_part = sliding_log_part,
	.reset_keys = sliding_log_reset_keys,
	.full_ms = sliding_log_full_ms,
};
