/*
 * pipeline.c
 *	  The script protocol: Lua scripts run by their SHA1 (EVALSHA), with the
 *	  body sent once more (EVAL) after NOSCRIPT; any number of calls in one
 *	  pipeline per node, each with its own answer.
 *
 * The interface is "run these script calls for these keys": the caller groups
 * keys (every key of a call shares a hash tag) and reads each call's outcome.
 * Each call goes to the node that holds its keys (cluster.c): for a Redis
 * Cluster the master of their slot, found again at once when a reply says
 * MOVED or ASK, at most REDIS_MAX_REDIRECTS times and within the same
 * deadline. Every node has its breaker (breaker.c): calls to a node that
 * cannot be reached skip Redis, the others go on.
 */
#include "prelude.h"

#include "utils/builtins.h"

#include "base/clock.h"
#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/pipeline.h"
#include "redis/resp.h"
#include "redis/url.h"

/* The most times one call may be redirected (MOVED, ASK) before it fails. */
#define REDIS_MAX_REDIRECTS 5

/* What a reply of an exchange answers, besides a call (whose index it is then). */
#define SENT_SLOT_MAP (-1)
#define SENT_ASKING (-2)

/* Queues EVALSHA (or EVAL with the body) of one call, after ASKING if it was redirected so. */
static void
redis_append_call(const RedisCall *call, bool by_sha)
{
	int			argc = 3 + call->nkeys + call->nargs;
	const char **argv = palloc(argc * sizeof(char *));
	char		key_count[12];

	if (call->asking)
	{
		const char *asking[1] = {"ASKING"};

		resp_append_command(connection_output(), 1, asking);
	}
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

/* The calls of a run, and for an exchange with one node what each reply answers. */
typedef struct Pipeline
{
	RedisCall  *calls;
	int			ncalls;
	int			command_timeout_ms; /* for each thousand calls (deadline.c) */
	int64		first_sent_us;	/* when the run's first byte went out; 0: not yet */
	int			node;			/* of the exchange under way */
	int		   *sent;			/* for each reply: a call's index, SENT_SLOT_MAP or SENT_ASKING */
	int			resend;			/* calls that answered NOSCRIPT */
	bool		map_pending;	/* the slot map was asked for, its reply not yet read */
} Pipeline;

/* Takes a redirect: the call goes to the node named next, or fails when it went too often. */
static void
call_redirected(RedisCall *call, const RespValue *reply, int from_node)
{
	bool		ask;
	int			node;

	if (!cluster_redirect(reply->str, reply->length, from_node, &ask, &node))
	{
		redis_fail(&call->failure, REDIS_FAILURE_REDIRECT, "a node that cannot be used");
		return;
	}
	if (call->redirects == REDIS_MAX_REDIRECTS)
	{
		redis_fail(&call->failure, REDIS_FAILURE_REDIRECT, "redirected too often");
		return;
	}
	call->redirects++;
	call->node = node;
	call->asking = ask;
	/* Not yet done: it is sent again, to its new node. */
	call->failure.maybe_ran = false;
}

/* Per target (url.h): its Redis refused a shebang (#!lua, Redis 7+): none sent there again. */
static bool no_shebangs[REDIS_MAX_TARGETS];

/* True when reply is the compile error of a Redis older than 7 given a shebang. */
static bool
shebang_refused(const RespValue *reply)
{
	static const char compile[] = "Error compiling script";

	for (int i = 0; i + (int) sizeof(compile) - 1 <= reply->length; i++)
		if (memcmp(reply->str + i, compile, sizeof(compile) - 1) == 0)
			return true;
	return false;
}

/* Stores one reply: the slot map, ASKING's, or a call's integers, or why there are none. */
static void
call_reply(int index, const RespValue *reply, void *arg)
{
	Pipeline   *pipeline = arg;
	RedisCall  *call;
	RespIterator elements;
	RespValue	element;
	int			n = 0;

	if (pipeline->sent[index] == SENT_SLOT_MAP)
	{
		pipeline->map_pending = false;
		cluster_learn_map(reply, pipeline->node);
		return;
	}
	if (pipeline->sent[index] == SENT_ASKING)
		return;					/* its error, if any, comes again with the call */
	call = &pipeline->calls[pipeline->sent[index]];
	memset(&call->failure, 0, sizeof(call->failure));
	call->failure.maybe_ran = true;
	call->done = true;
	if (reply->type == RESP_ERROR)
	{
		if (cluster_is_redirect(reply->str, reply->length))
		{
			call_redirected(call, reply, pipeline->node);
			call->done = call->failure.kind != REDIS_FAILURE_NONE;
			return;
		}
		/* Redis restarted, failed over or flushed its scripts: sent again with the body. */
		redis_fail_with_error(&call->failure, reply->str, reply->length);
		if (call->script->plain != NULL && shebang_refused(reply))
		{
			/* A Redis older than 7 knows no shebang: the same script without it. */
			no_shebangs[redis_url_target()] = true;
			call->script = call->script->plain;
			call->failure.kind = REDIS_FAILURE_NOSCRIPT;
		}
		if (call->failure.kind == REDIS_FAILURE_NOSCRIPT)
		{
			call->done = false;
			pipeline->resend++;
		}
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

/* True when calls[i] goes to node in this exchange. */
static bool
call_for(const Pipeline *pipeline, int i, int node)
{
	return !pipeline->calls[i].done && pipeline->calls[i].node == node;
}

/* True when a call after calls[i] to the same node runs the same script. */
static bool
script_used_again(const Pipeline *pipeline, int i)
{
	for (int j = i + 1; j < pipeline->ncalls; j++)
		if (call_for(pipeline, j, pipeline->node) &&
			pipeline->calls[j].script == pipeline->calls[i].script)
			return true;
	return false;
}

/*
 * Whether calls[i], sent for the first time, names its script by SHA1
 * (EVALSHA) rather than carrying its body (EVAL). By SHA1 once the node's
 * connection has sent the script, and the first time too when the exchange
 * has no other call of it: Redis most likely has it cached already, and
 * NOSCRIPT would cost one call sent again. But the first of many calls of a
 * script new to the connection (the refunds of a rollback, after a reconnect)
 * carries the body: else every one of them could answer NOSCRIPT and go twice.
 */
static bool
call_by_sha(const Pipeline *pipeline, int i)
{
	if (connection_script_sent(pipeline->node, pipeline->calls[i].script))
		return true;
	return !script_used_again(pipeline, i);
}

/* True when script is one of the count in list; else adds it there. */
static bool
script_listed(const LuaScript **list, int *count, const LuaScript *script)
{
	for (int i = 0; i < *count; i++)
		if (list[i] == script)
			return true;
	list[(*count)++] = script;
	return false;
}

/* How redis_send_calls sends: the first time, or again after NOSCRIPT. */
typedef enum SendPass
{
	SEND_FIRST,					/* every call; see call_by_sha */
	SEND_AGAIN,					/* those that answered NOSCRIPT: one per script with its body */
	SEND_EACH_BODY				/* those that answered NOSCRIPT again: each with its body */
} SendPass;

/*
 * Sends the node's calls still to be sent and reads their replies (and the
 * slot map's, when cluster.c wants it). Sent again, the first call of
 * each script carries its body, which loads it, and the others name it by
 * SHA1; should Redis drop the script before those run (Redis 7.4 evicts
 * scripts that EVAL loaded), they go once more, each with its body.
 */
static bool
redis_send_calls(Pipeline *pipeline, SendPass pass, int64 deadline, RedisFailure *failure)
{
	const LuaScript **loaded = pass == SEND_AGAIN ?
		palloc(pipeline->ncalls * sizeof(LuaScript *)) : NULL;
	int			nloaded = 0;
	int			count = 0;
	int64		now = clock_monotonic_us();

	for (int i = 0; i < pipeline->ncalls; i++)
	{
		RedisCall  *call = &pipeline->calls[i];
		bool		by_sha;

		if (!call_for(pipeline, i, pipeline->node) ||
			(pass != SEND_FIRST && call->failure.kind != REDIS_FAILURE_NOSCRIPT))
			continue;
		if (no_shebangs[redis_url_target()] && call->script->plain != NULL)
			call->script = call->script->plain;
		/* Sent: until it answers, it is a request that went out. */
		memset(&call->failure, 0, sizeof(call->failure));
		call->failure.maybe_ran = true;
		if (call->first_sent_us == 0)
			call->first_sent_us = now;
		if (pass == SEND_FIRST)
			by_sha = call_by_sha(pipeline, i);
		else if (pass == SEND_AGAIN)
			by_sha = script_listed(loaded, &nloaded, call->script);
		else
			by_sha = false;
		if (call->asking)
			pipeline->sent[count++] = SENT_ASKING;
		redis_append_call(call, by_sha);
		pipeline->sent[count++] = i;
	}
	if (loaded != NULL)
		pfree(loaded);
	/*
	 * The slot map, when wanted, after the calls: were it unreadable (too
	 * large, or a proxy that closes on CLUSTER), they have their answers.
	 */
	if (pass == SEND_FIRST && cluster_wants_map())
	{
		const char *argv[2] = {"CLUSTER", "SLOTS"};

		resp_append_command(connection_output(), 2, argv);
		pipeline->sent[count++] = SENT_SLOT_MAP;
		pipeline->map_pending = true;
		cluster_map_asked();
	}
	pipeline->resend = 0;
	if (count == 0)
		return true;
	/* Each call answers within command_timeout of the one before (exchange.c). */
	if (!connection_exchange(pipeline->node, count, deadline,
							 (int64) pipeline->command_timeout_ms * 1000, call_reply, pipeline, failure))
	{
		if (pipeline->map_pending)
			cluster_map_unreadable();
		pipeline->map_pending = false;
		return false;
	}
	return true;
}

/*
 * Runs the pending calls of one node in one exchange (and the NOSCRIPT
 * rounds). False, with failure, when the connection failed.
 */
static bool
node_exchange(Pipeline *pipeline, RedisFailure *failure)
{
	int			node = pipeline->node;
	bool		opened;
	bool		reopened = false;
	int64		request_deadline;
	bool		ok;

	for (;;)
	{
		if (!connection_open(node, 0, &opened, failure))
		{
			failure->new_connection = true;
			return false;
		}
		reopened |= opened;
		if (pipeline->first_sent_us == 0)
			pipeline->first_sent_us = clock_monotonic_us();
		/* From the run's first byte: the calls of every node count. */
		request_deadline = pipeline->first_sent_us +
			deadline_for_calls_us(pipeline->ncalls, pipeline->command_timeout_ms);
		/*
		 * A redirect, or the next node of a batch, with the deadline spent
		 * (connecting took it): nothing goes out, and this says nothing of the
		 * node.
		 */
		if (clock_monotonic_us() >= request_deadline)
		{
			redis_fail(failure, REDIS_FAILURE_TIMEOUT, "no time left for this node");
			failure->backend_only = true;
			return false;
		}
		connection_begin(node);
		ok = redis_send_calls(pipeline, SEND_FIRST, request_deadline, failure);
		/* A connection that broke before any of the request went out is opened again, once. */
		if (ok || reopened || failure->maybe_ran || failure->kind != REDIS_FAILURE_IO)
			break;
		memset(failure, 0, sizeof(*failure));
		reopened = true;
	}
	if (ok && pipeline->resend > 0)
		ok = redis_send_calls(pipeline, SEND_AGAIN, request_deadline, failure);
	if (ok && pipeline->resend > 0)
		ok = redis_send_calls(pipeline, SEND_EACH_BODY, request_deadline, failure);
	if (!ok)
	{
		if (opened)
			failure->new_connection = true;
		return false;
	}
	connection_done(node);
	return true;
}

/* The failure a node's breaker records: the connection's, else the worst of its calls'. */
static const RedisFailure *
node_outcome(const Pipeline *pipeline, const RedisFailure *connection_failure)
{
	const RedisFailure *outcome = connection_failure;

	if (connection_failure->kind != REDIS_FAILURE_NONE)
		return connection_failure;
	for (int i = 0; i < pipeline->ncalls; i++)
	{
		const RedisCall *call = &pipeline->calls[i];

		if (call->node != pipeline->node || call->failure.kind == REDIS_FAILURE_NONE)
			continue;
		if (redis_failure_wrong_node(call->failure.kind))
			return &call->failure;
		if (outcome->kind == REDIS_FAILURE_NONE)
			outcome = &call->failure;
	}
	return outcome;
}

/* Takes in the slot map a node sent (map_elsewhere). */
static void
map_reply(int index, const RespValue *reply, void *arg)
{
	cluster_learn_map(reply, *(int *) arg);
}

/*
 * Reads the slot map from a master other than lost that its breaker lets
 * through: one round trip, one node tried. After a master is lost, this is
 * how its slots find the replica promoted in its place.
 */
static void
map_elsewhere(const Pipeline *pipeline, int lost)
{
	const char *argv[2] = {"CLUSTER", "SLOTS"};

	for (int node = 0; node < cluster_node_count(); node++)
	{
		if (node == lost || cluster_node_slots(node) == 0 ||
			breaker_is_open(breaker_for(cluster_node_name(node))))
			continue;
		cluster_map_asked();
		(void) connection_ask(node, 2, argv,
							  clock_monotonic_us() + (int64) pipeline->command_timeout_ms * 1000,
							  map_reply, &node);
		return;
	}
}

/*
 * After node's exchange (ok, or failure): each call of the run (in_run)
 * gets its answer, its round trip and retry-after, or goes on to next_seed
 * (not negative: the node was a seed that cannot be reached) or to its
 * slot's new master.
 */
static void
node_results(Pipeline *pipeline, int node, const bool *in_run, bool ok,
			 const RedisFailure *failure, int next_seed, BreakerState *breaker)
{
	const char *name = cluster_node_name(node);
	int64		now = clock_monotonic_us();

	for (int i = 0; i < pipeline->ncalls; i++)
	{
		RedisCall  *call = &pipeline->calls[i];

		if (!in_run[i])
			continue;
		if (next_seed >= 0)
		{
			call->node = next_seed;
			continue;
		}
		/* Not sent, and its slot has another master now: sent there. */
		if (!ok && !failure->maybe_ran && !call->done && cluster_enabled() &&
			cluster_route(call->keys[0]) != node && call->redirects < REDIS_MAX_REDIRECTS)
		{
			call->node = cluster_route(call->keys[0]);
			call->redirects++;
			continue;
		}
		/* A round trip is what came back: none for a call lost with its connection. */
		call->round_trip_us = ok && call->first_sent_us != 0 ? now - call->first_sent_us : -1;
		/* Even an answer can be unusable (a number out of range): the caller may need it. */
		call->retry_after_ms = breaker_retry_after_ms(breaker);
		/* Answered, or redirected (sent again, on the node named). */
		if (call->answered || (ok && !call->done && call->failure.kind == REDIS_FAILURE_NONE))
			continue;
		if (!ok)
			call->failure = *failure;	/* skipped (kind NONE), or lost with the connection */
		call->done = true;		/* also a call that answered NOSCRIPT every round */
		strlcpy(call->failure.node, cluster_enabled() ? name : "", sizeof(call->failure.node));
		/* A node that cannot serve (a replica now): the next call connects anew. */
		if (ok && redis_failure_wrong_node(call->failure.kind))
		{
			connection_discard(node);
			cluster_map_doubt();
		}
		/* A password wanted or refused: the next connection authenticates with the one set then. */
		if (ok && call->failure.kind == REDIS_FAILURE_AUTH)
			connection_discard(node);
	}
}

/*
 * Runs the pending calls of node through its breaker: skipped while it is
 * open, else sent; every call that finishes here is done, and those
 * redirected elsewhere are left for the next node. While the URL's nodes have
 * not said whether they are a cluster, one that cannot be reached hands its
 * calls to the next.
 */
static void
node_run(Pipeline *pipeline, int node)
{
	const char *name = cluster_node_name(node);
	BreakerState *breaker = breaker_for(name);
	RedisFailure failure = {0};
	bool	   *in_run = palloc(pipeline->ncalls * sizeof(bool));
	bool		probing;
	bool		ok = false;
	int			next_seed = -1;

	pipeline->node = node;
	for (int i = 0; i < pipeline->ncalls; i++)
		in_run[i] = call_for(pipeline, i, node);
	if (!breaker_begin(breaker, &probing))
		next_seed = cluster_seed_after(node);	/* a seed known to be down: the next */
	else
	{
		if (probing)
		{
			PG_TRY();
			{
				ok = node_exchange(pipeline, &failure);
			}
			PG_CATCH();
			{
				breaker_abandon(breaker);
				PG_RE_THROW();
			}
			PG_END_TRY();
		}
		else
			ok = node_exchange(pipeline, &failure);
		if (!ok)
			breaker_weigh(node, &failure);
		/* A cluster node is named in the log and rl_health; the URL's one node needs no name. */
		strlcpy(failure.node, cluster_enabled() ? name : "", sizeof(failure.node));
		breaker_end(breaker, node_outcome(pipeline, &failure));
		/* A seed that cannot be reached before the map is known: the next. */
		if (!ok && !failure.maybe_ran)
			next_seed = cluster_seed_after(node);
	}
	/* A cluster node lost or skipped: its slots may have moved to a replica promoted since. */
	if (!ok && next_seed < 0 && cluster_enabled() && !failure.backend_only)
	{
		cluster_map_doubt();
		if (!failure.maybe_ran && cluster_wants_map())
			map_elsewhere(pipeline, node);
	}
	node_results(pipeline, node, in_run, ok, &failure, next_seed, breaker);
	pfree(in_run);
}

/*
 * Runs calls, one pipeline (one write, one round trip) per node, and stores
 * each one's answer in it, with its round trip. Each node is given
 * connect_timeout to connect, and the calls command_timeout_ms (0: this
 * session's command_timeout) for each thousand of them, from the first byte
 * sent (deadline_for_calls_us).
 * Returns true when every call was answered; else false, with the failure of
 * the first that was not (kind NONE: its node's breaker is open, Redis was not
 * asked): each call has its own, and failure->maybe_ran says whether it may
 * have run. Never raises an error itself, except for an interrupt served
 * while waiting.
 */
bool
pipeline_run(RedisCall *calls, int ncalls, int command_timeout_ms, RedisFailure *failure)
{
	Pipeline	pipeline = {
		.calls = calls,
		.ncalls = ncalls,
		.command_timeout_ms = command_timeout_ms > 0 ? command_timeout_ms : deadline_command_timeout_ms,
	};

	Assert(ncalls > 0);
	memset(failure, 0, sizeof(*failure));
	cluster_prepare();
	connection_close_stale();
	for (int i = 0; i < ncalls; i++)
	{
		RedisCall  *call = &calls[i];

		Assert(call->nresults > 0 && call->nkeys > 0);
#ifdef USE_ASSERT_CHECKING
		/* Every key of a call in one slot: no CROSSSLOT, by construction. */
		for (int k = 1; k < call->nkeys; k++)
			Assert(cluster_key_slot(call->keys[k], strlen(call->keys[k])) ==
				   cluster_key_slot(call->keys[0], strlen(call->keys[0])));
#endif
		call->answered = call->done = call->asking = false;
		call->round_trip_us = -1;
		call->retry_after_ms = 0;
		call->redirects = 0;
		call->first_sent_us = 0;
		call->node = cluster_route(call->keys[0]);
		memset(&call->failure, 0, sizeof(call->failure));
	}
	/* One SLOTS request, ASKING and the call for each: room for every reply. */
	pipeline.sent = palloc((2 * ncalls + 1) * sizeof(int));

	/* A node at a time; each redirect sends its call once more, so this ends. */
	for (;;)
	{
		int			node = -1;

		for (int i = 0; i < ncalls && node < 0; i++)
			if (!calls[i].done)
				node = calls[i].node;
		if (node < 0)
			break;
		node_run(&pipeline, node);
	}
	pfree(pipeline.sent);
	for (int i = 0; i < ncalls; i++)
		if (!calls[i].answered)
		{
			*failure = calls[i].failure;
			return false;
		}
	return true;
}
