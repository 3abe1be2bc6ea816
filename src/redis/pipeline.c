/*
 * pipeline.c
 *	  The script protocol: Lua scripts run by their SHA1 (EVALSHA), with the
 *	  body sent once more (EVAL) after NOSCRIPT; any number of calls in one
 *	  pipeline, each with its own answer.
 *
 * The interface is "run these script calls for these keys": the caller groups
 * keys (every key of a call shares a hash tag) and reads each call's outcome,
 * so that routing calls to the nodes of a Redis Cluster, or another socket
 * layer, can come behind it.
 */
#include "prelude.h"

#include "utils/builtins.h"

#include "base/clock.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/pipeline.h"
#include "redis/resp.h"

/* Queues EVALSHA (or EVAL with the body) of one call. */
static void
redis_append_call(const RedisCall *call, bool by_sha)
{
	int			argc = 3 + call->nkeys + call->nargs;
	const char **argv = palloc(argc * sizeof(char *));
	char		key_count[12];

	snprintf(key_count, sizeof(key_count), "%d", call->nkeys);
	argv[0] = by_sha ? "EVALSHA" : "EVAL";
	argv[1] = by_sha ? call->script->sha1 : call->script->body;
	argv[2] = key_count;
	for (int i = 0; i < call->nkeys; i++)
		argv[3 + i] = call->keys[i];
	for (int i = 0; i < call->nargs; i++)
		argv[3 + call->nkeys + i] = call->args[i];
	resp_append_command(connection_output(), argc, argv);
	pfree(argv);
}

/* The calls of a pipeline and, for the exchange, which of them each reply answers. */
typedef struct Pipeline
{
	RedisCall  *calls;
	int		   *sent;			/* index in calls of each command sent */
	int			resend;			/* calls that answered NOSCRIPT */
} Pipeline;

/* Stores one call's reply: its integers, or why there are none. */
static void
call_reply(int index, const RespValue *reply, void *arg)
{
	Pipeline   *pipeline = arg;
	RedisCall  *call = &pipeline->calls[pipeline->sent[index]];
	RespIterator elements;
	RespValue	element;
	int			n = 0;

	memset(&call->failure, 0, sizeof(call->failure));
	call->failure.maybe_ran = true;
	if (reply->type == RESP_ERROR)
	{
		/* Redis restarted, failed over or flushed its scripts: sent again with the body. */
		redis_fail_with_error(&call->failure, reply->str, reply->length);
		if (call->failure.kind == REDIS_FAILURE_NOSCRIPT)
			pipeline->resend++;
		return;
	}
	if (reply->type != RESP_ARRAY || reply->length != call->nresults)
	{
		redis_fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		return;
	}
	resp_iterate(reply, &elements);
	while (resp_next(&elements, &element))
	{
		if (element.type != RESP_INTEGER)
		{
			redis_fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
			return;
		}
		call->results[n++] = element.integer;
	}
	call->answered = true;
	call->failure.maybe_ran = false;
}

/*
 * The scripts the current connection has sent: Redis has them in its cache
 * from then on, unless it restarted or flushed them (then NOSCRIPT says so).
 * More room than there are scripts.
 */
#define SENT_SCRIPTS_MAX 64
static const LuaScript *sent_scripts[SENT_SCRIPTS_MAX];
static int	sent_script_count = 0;

/* True when script is one of the count in list; else adds it there, if there is room. */
static bool
script_listed(const LuaScript **list, int *count, int room, const LuaScript *script)
{
	for (int i = 0; i < *count; i++)
		if (list[i] == script)
			return true;
	if (*count < room)
		list[(*count)++] = script;
	return false;
}

/* True when a call after calls[i] runs the same script. */
static bool
script_used_again(const RedisCall *calls, int ncalls, int i)
{
	for (int j = i + 1; j < ncalls; j++)
		if (calls[j].script == calls[i].script)
			return true;
	return false;
}

/*
 * Whether calls[i], sent for the first time, names its script by SHA1
 * (EVALSHA) rather than carrying its body (EVAL). By SHA1 once the connection
 * has sent the script, and the first time too when the pipeline has no other
 * call of it: Redis most likely has it cached already, and NOSCRIPT would cost
 * one call sent again. But the first of many calls of a script new to the
 * connection (the refunds of a rollback, after a reconnect) carries the body:
 * else every one of them could answer NOSCRIPT and go twice.
 */
static bool
call_by_sha(const RedisCall *calls, int ncalls, int i)
{
	if (script_listed(sent_scripts, &sent_script_count, SENT_SCRIPTS_MAX, calls[i].script))
		return true;
	return !script_used_again(calls, ncalls, i);
}

/* How redis_send_calls sends: the first time, or again after NOSCRIPT. */
typedef enum SendPass
{
	SEND_FIRST,					/* every call; see call_by_sha */
	SEND_AGAIN,					/* those that answered NOSCRIPT: one per script with its body */
	SEND_EACH_BODY				/* those that answered NOSCRIPT again: each with its body */
} SendPass;

/*
 * Sends the calls still to be sent and reads their replies. Sent again, the
 * first call of each script carries its body, which loads it, and the others
 * name it by SHA1; should Redis drop the script before those run (Redis 7.4
 * evicts scripts that EVAL loaded), they go once more, each with its body.
 */
static bool
redis_send_calls(Pipeline *pipeline, int ncalls, SendPass pass, int64 deadline,
				 RedisFailure *failure)
{
	const LuaScript **loaded = pass == SEND_AGAIN ? palloc(ncalls * sizeof(LuaScript *)) : NULL;
	int			nloaded = 0;
	int			count = 0;

	for (int i = 0; i < ncalls; i++)
	{
		RedisCall  *call = &pipeline->calls[i];
		bool		by_sha;

		if (pass != SEND_FIRST && call->failure.kind != REDIS_FAILURE_NOSCRIPT)
			continue;
		/* Sent again: until it answers, it is a request that went out. */
		memset(&call->failure, 0, sizeof(call->failure));
		call->failure.maybe_ran = true;
		if (pass == SEND_FIRST)
			by_sha = call_by_sha(pipeline->calls, ncalls, i);
		else if (pass == SEND_AGAIN)
			by_sha = script_listed(loaded, &nloaded, ncalls, call->script);
		else
			by_sha = false;
		redis_append_call(call, by_sha);
		pipeline->sent[count++] = i;
	}
	if (loaded != NULL)
		pfree(loaded);
	pipeline->resend = 0;
	if (count == 0)
		return true;
	return connection_exchange(count, deadline, call_reply, pipeline, failure);
}

/*
 * Runs calls in one pipeline (one write, one round trip) and stores each one's
 * answer in it, with the pipeline's round trip. deadline (clock_monotonic_us
 * time) bounds it all, connect included; 0 means the usual deadlines
 * (connect_timeout to connect, then command_timeout from the first byte sent).
 * Returns false, saying why in failure, when the connection failed: the calls
 * answered before that keep their answers, and failure->maybe_ran says whether
 * the others may have run. A call Redis answered with an error has it in its
 * own failure. Never raises an error itself, except for an interrupt served
 * while waiting.
 */
bool
redis_run_scripts(RedisCall *calls, int ncalls, int64 deadline, RedisFailure *failure)
{
	Pipeline	pipeline = {.calls = calls};
	bool		opened;
	bool		reopened = false;
	int64		sent = 0;
	int64		request_deadline = 0;
	bool		ok;

	Assert(ncalls > 0);
	memset(failure, 0, sizeof(*failure));
	for (int i = 0; i < ncalls; i++)
	{
		Assert(calls[i].nresults > 0 && calls[i].nkeys > 0);
		calls[i].answered = false;
		calls[i].round_trip_us = -1;
		memset(&calls[i].failure, 0, sizeof(calls[i].failure));
	}
	pipeline.sent = palloc(ncalls * sizeof(int));

	for (;;)
	{
		if (!connection_open(deadline, &opened, failure))
		{
			failure->new_connection = true;
			pfree(pipeline.sent);
			return false;
		}
		reopened |= opened;
		if (opened)
			sent_script_count = 0;
		sent = clock_monotonic_us();
		request_deadline = deadline != 0 ? deadline :
			sent + (int64) deadline_command_timeout_ms * 1000;
		connection_begin();
		ok = redis_send_calls(&pipeline, ncalls, SEND_FIRST, request_deadline, failure);
		/* A connection that broke before any of the request went out is opened again, once. */
		if (ok || reopened || failure->maybe_ran || failure->kind != REDIS_FAILURE_IO)
			break;
		memset(failure, 0, sizeof(*failure));
		reopened = true;
	}
	if (ok && pipeline.resend > 0)
		ok = redis_send_calls(&pipeline, ncalls, SEND_AGAIN, request_deadline, failure);
	if (ok && pipeline.resend > 0)
		ok = redis_send_calls(&pipeline, ncalls, SEND_EACH_BODY, request_deadline, failure);
	if (ok)
	{
		int64		round_trip_us = clock_monotonic_us() - sent;

		connection_done();
		for (int i = 0; i < ncalls; i++)
		{
			calls[i].round_trip_us = round_trip_us;
			/* A node that cannot serve (a replica now): the next call connects anew. */
			if (redis_failure_wrong_node(calls[i].failure.kind))
				connection_discard();
		}
	}
	else if (opened)
		failure->new_connection = true;
	pfree(pipeline.sent);
	return ok;
}
