/*
 * ask.c
 *	  What one decision asks Redis, and how the reply reads: the script of its
 *	  algorithm and mode (a take that may wait books, a take with a request id
 *	  is made once), its keys and numbers; the numbers it answers.
 */
#include "prelude.h"

#include "base/clock.h"
#include "algorithm/window.h"
#include "engine/ask.h"
#include "policy/placement.h"
#include "policy/subject.h"

/* The Redis key of request's bucket: the one fixed in advance, or built now (palloc'd). */
const char *
decision_key(const DecisionRequest *request)
{
	StringInfoData key;

	if (request->redis_key != NULL)
		return request->redis_key;
	initStringInfo(&key);
	subject_build_key(&key, &request->policy, request->subject, request->length);
	return key.data;
}

/*
 * Fills call from an algorithm's script, keys and numbers: the clock first
 * (a test clock, or Redis's), then the nextras numbers of extras (a slice's
 * most to take, a booking's wait and debt); room for nresults numbers of the
 * reply. All allocated in the current memory context. (At most 10
 * arguments: a Redis that wants a password we were not given answers NOAUTH
 * only to at most 10, and NOAUTH is what says why. A slice's take has 11, but
 * only a subject that Redis granted before is sliced.)
 */
void
ask_call_of(const LimitCall *part, const int64 *extras, int nextras, int nresults, RedisCall *call)
{
	const char **keys = palloc(Max(part->nkeys, 1) * sizeof(char *));
	const char **args = palloc((1 + part->nargs + nextras) * sizeof(char *));
	int			nargs = 0;

	memcpy(keys, part->keys, part->nkeys * sizeof(char *));
	args[nargs++] = clock_test_ms();
	memcpy(&args[nargs], part->args, part->nargs * sizeof(char *));
	nargs += part->nargs;
	for (int i = 0; i < nextras; i++)
		args[nargs++] = psprintf(INT64_FORMAT, extras[i]);
	memset(call, 0, sizeof(*call));
	call->script = part->script;
	call->nkeys = part->nkeys;
	call->keys = keys;
	call->nargs = nargs;
	call->args = args;
	call->nresults = nresults;
	call->results = palloc(nresults * sizeof(long long));
}

/* The Redis key that remembers a grant of request (lua/once.lua): beside key, in its slot. */
static const char *
request_key(const DecisionRequest *request, const char *key)
{
	return psprintf("%s:request:%s", key, request->request_id);
}

/* The script mode of a call of request in mode: a take that may wait books. */
static LimitMode
script_mode(const DecisionRequest *request, LimitMode mode)
{
	return mode == LIMIT_TAKE && request->max_wait_ms > 0 ? LIMIT_BOOK : mode;
}

/* True when a call of request in mode is made once per request id. */
static bool
made_once(const DecisionRequest *request, LimitMode mode)
{
	return mode == LIMIT_TAKE && request->request_id != NULL;
}

/*
 * Fills call with the script of request's algorithm and mode at at_ms, on
 * key: a refund with an id has its mark after it (sharing its hash tag), then
 * the request id it forgets; a take that may wait books (its wait and the
 * policy's debt follow its numbers); a take with a request id is made once
 * (the id's key and memory follow). Its reply: 4 numbers, then the wait a
 * booking answers (a take made once: 0 when it books nothing) or the limit
 * of a window that answers it (limit_answers_limit), then whether a take made
 * once was a replay.
 */
void
ask_call(const DecisionRequest *request, LimitMode mode, const char *key, int64 at_ms,
			 int64 slice_most, RedisCall *call)
{
	const LimitParams *params = &request->policy.bucket;
	LimitMode	script = script_mode(request, mode);
	const char *mark = NULL;
	LimitCall	part = {0};
	int64		extras[3];
	int			nextras = 0;
	int			nresults = 4;

	if (request->refund_id != NULL)
		mark = psprintf("%s:refund:%s", key, request->refund_id);
	limit_ops(params)->call(params, script, key, request->cost, at_ms, mark, &part);
	if (part.answers_limit)
		nresults = 5;
	/* A split policy's peek looks at this region's share of the window (engine/region.c). */
	if (mode == LIMIT_PEEK && request->policy.region_mode == REGION_MODE_SPLIT)
		part.args[0] = window_number(placement_share(&request->policy));
	if (mode == LIMIT_REFUND && mark != NULL && request->request_id != NULL)
		part.keys[part.nkeys++] = request_key(request, key);
	if (script == LIMIT_SLICE)
		extras[nextras++] = slice_most;
	if (script == LIMIT_BOOK)
	{
		extras[nextras++] = request->max_wait_ms;
		nresults++;
	}
	if (script == LIMIT_BOOK || script == LIMIT_OWE)
		extras[nextras++] = policy_max_debt(&request->policy);
	if (made_once(request, mode))
	{
		Assert(part.script->once != NULL);
		part.script = part.script->once;
		part.keys[part.nkeys++] = request_key(request, key);
		extras[nextras++] = request->policy.replay_window_ms;
		nresults = 6;
	}
	ask_call_of(&part, extras, nextras, nresults, call);
	call->target = request->target;
}

/* The call of request as it is, at its own time (a reservation's refund at its end). */
void
decision_redis_call(const DecisionRequest *request, RedisCall *call)
{
	ask_call(request, request->mode, decision_key(request), request_at_ms(request), 0, call);
}

/*
 * Fills decision from a script's four numbers {allowed, remaining,
 * retry_after_ms, reset_after_ms} (a slice's first is the tokens it took: 0
 * denies); false, with a protocol failure, when they make no sense.
 */
bool
decision_from_reply(const long long *results, bool slice, Decision *decision,
					RedisFailure *failure)
{
	if (results[1] < 0 || results[2] < 0 || results[3] < 0)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	decision->allowed = slice ? results[0] > 0 : results[0] == 1;
	decision->remaining = results[1];
	decision->retry_after_ms = results[2];
	decision->reset_after_ms = results[3];
	decision->source = DECISION_SOURCE_REDIS;
	return true;
}

/*
 * Reads what follows a reply's four numbers into decision (request's): a booking's
 * wait (a replay's: until the turn its first asking booked), or a rollover
 * window's limit (its capacity), a replay's mark;
 * false, with a protocol failure, when they make no sense.
 */
bool
ask_reply_extras(const DecisionRequest *request, const RedisCall *call, Decision *decision,
				 RedisFailure *failure)
{
	const LimitParams *params = &request->policy.bucket;
	/* (A slice fetched for a take answers four numbers, no limit.) */
	bool		limit = call->nresults > 4 &&
		limit_answers_limit(params, script_mode(request, request->mode));
	long long	wait = call->nresults > 4 && !limit ? call->results[4] : 0;
	long long	replay = call->nresults > 5 ? call->results[5] : 0;

	/*
	 * A window with rollover: the limit it counts against, the capacity and
	 * what it carried, at most the capacity (a window begun under a larger
	 * rollover keeps what it carried).
	 */
	if (limit)
	{
		if (call->results[4] < params->capacity || call->results[4] > 2 * params->capacity)
			return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		decision->capacity = call->results[4];
	}

	if (wait < 0 || wait > (replay ? REQUEST_MAX_WAIT_MS : request->max_wait_ms) ||
		(wait > 0 && !decision->allowed) ||
		replay < 0 || replay > 1)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	decision->wait_ms = wait;
	/* A settle's first number is what it took: all of the cost, or what the debt allowed. */
	if (request->mode == LIMIT_OWE)
	{
		if (call->results[0] < 0 || call->results[0] > request->cost)
			return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		decision->settled = call->results[0];
		decision->allowed = decision->settled == request->cost;
	}
	if (replay)
		decision->source = DECISION_SOURCE_REPLAY;
	return true;
}

