/*
 * connection.c
 *	  One Redis connection per node and backend, opened lazily, used without
 *	  ever blocking.
 *
 * The nodes are cluster.c's: node 0 is the URL's (for a Sentinel URL, the
 * master its sentinels name), the others the nodes of a Redis Cluster, each
 * reached with the URL's TLS, user and password.
 *
 * Opening one is: for a Sentinel URL, finding the master (sentinel.c); then
 * connecting (stream.c: the socket, with TLS for rediss://), and AUTH, SELECT
 * and, for a Sentinel URL, ROLE in one round trip, all within
 * connect_timeout. A node that ROLE says is not the master is not used.
 * Requests then go through exchange.c, one deadline each; pipeline.c says what
 * to send.
 *
 * A connection whose request was cut off (deadline, error, interrupt) is
 * closed, never reused: it might still deliver the old answer. An idle
 * connection that Redis closed meanwhile (a restart, a timeout, CLIENT KILL)
 * is noticed before the request is written and opened again within the same
 * call; only a request that Redis may have run goes to the fail mode. A
 * connection is closed too when its node says it cannot serve (READONLY,
 * LOADING, MASTERDOWN), so that the next one finds the master again.
 */
#include "prelude.h"

#include "access/xact.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/secret.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/exchange.h"
#include "redis/sentinel.h"
#include "redis/stream.h"
#include "redis/tls.h"
#include "redis/url.h"

/* The scripts one connection has sent; more room than there are scripts. */
#define SENT_SCRIPTS_MAX 64

typedef struct RedisConnection
{
	RedisStream stream;
	char	   *url;			/* the ratelimit.redis_url it was opened with */
	uint32		epoch;			/* cluster_epoch() when it was opened */
	bool		busy;			/* a request is under way (or was cut off) */
	char		node[300];		/* the node it is connected to, for rl_health ("" none) */
	uint32		tls_generation; /* tls_settings_generation() when it was opened */
	/* A connection found through Sentinel: the master's address, when to ask again. */
	bool		sentinel;
	char		master_host[256];
	int			master_port;
	int64		next_check_us;
	/* Scripts sent on it: Redis has them cached, unless it restarted or flushed them. */
	const LuaScript *sent_scripts[SENT_SCRIPTS_MAX];
	int			sent_script_count;
} RedisConnection;

/* Per target (url.h), allocated as nodes are first used. */
static RedisConnection *target_connections[REDIS_MAX_TARGETS][REDIS_MAX_NODES];

/* The connections of the target in use. */
#define connections (target_connections[redis_url_target()])

/* How often a connection found through Sentinel checks that its node is still the master. */
static int	sentinel_check_interval_ms = 1000;

/* The connection of a node, allocated (closed) the first time. */
static RedisConnection *
connection_of(int node)
{
	Assert(node >= 0 && node < REDIS_MAX_NODES);
	if (connections[node] == NULL)
	{
		RedisStream closed = REDIS_STREAM_CLOSED;

		connections[node] = MemoryContextAllocZero(TopMemoryContext, sizeof(RedisConnection));
		connections[node]->stream = closed;
	}
	return connections[node];
}

/* Closes a connection and frees everything it holds. */
static void
redis_disconnect(RedisConnection *connection)
{
	stream_close(&connection->stream);
	if (connection->url != NULL)
		pfree(connection->url);
	connection->url = NULL;
	connection->busy = false;
	connection->sent_script_count = 0;
	exchange_reset();
}

/*
 * Runs an exchange on the connection. On failure the connection, whose state
 * is now unknown, is closed, and the resolved address goes too: after a
 * failover the name may point elsewhere.
 */
bool
connection_exchange(int node, int nreplies, int64 deadline, int64 idle_us, ExchangeReplyHandler handler,
					void *arg, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);

	Assert(stream_is_open(&connection->stream) && connection->busy);
	if (exchange_run(&connection->stream, nreplies, deadline, idle_us, handler, arg, failure))
		return true;
	redis_disconnect(connection);
	socket_forget_address();
	return false;
}

/*
 * Sends one command to node on its connection (opened first if need be) and
 * hands its reply to handler, all within deadline: a question on the side of
 * the calls (the slot map, a PING). False when no reply came.
 */
bool
connection_ask(int node, int argc, const char *const *argv, int64 deadline,
			   ExchangeReplyHandler handler, void *arg)
{
	RedisFailure failure = {0};
	bool		opened;

	if (!connection_open(node, deadline, &opened, &failure))
		return false;
	connection_begin(node);
	resp_append_command(connection_output(), argc, argv);
	if (!connection_exchange(node, 1, deadline, 0, handler, arg, &failure))
		return false;
	connection_done(node);
	return true;
}

/* What the handshake found: the first error reply, and whether ROLE said master. */
typedef struct HandshakeResult
{
	int			role_reply;		/* the index of ROLE's reply; -1: not asked */
	bool		refused;
	RedisFailure failure;
} HandshakeResult;

static void
handshake_reply(int index, const RespValue *reply, void *arg)
{
	HandshakeResult *result = arg;

	if (result->refused)
		return;
	if (reply->type == RESP_ERROR)
	{
		result->refused = true;
		redis_fail_with_error(&result->failure, reply->str, reply->length);
		if (result->failure.kind == REDIS_FAILURE_REPLY)
			result->failure.kind = REDIS_FAILURE_CONNECT;
	}
	else if (index == result->role_reply)
	{
		RespIterator elements;
		RespValue	role;

		if (reply->type == RESP_ARRAY && !reply->null)
			resp_iterate(reply, &elements);
		if (reply->type != RESP_ARRAY || reply->null || !resp_next(&elements, &role) ||
			!resp_is(&role, "master"))
		{
			result->refused = true;
			redis_fail(&result->failure, REDIS_FAILURE_READONLY, "ROLE: the node is not the master");
		}
	}
}

/* Sends AUTH, SELECT and ROLE, as the URL asks, in one round trip. */
static bool
redis_handshake(int node, const RedisUrl *url, const char *password, int64 deadline,
				RedisFailure *failure)
{
	StringInfo	out = exchange_output();
	HandshakeResult result = {.role_reply = -1};
	int			commands = 0;

	if (password != NULL)
	{
		const char *argv[3] = {"AUTH"};
		int			argc = 1;

		if (url->user != NULL)
			argv[argc++] = url->user;
		argv[argc++] = password;
		resp_append_command(out, argc, argv);
		commands++;
	}
	if (url->database != 0)
	{
		char		database[16];
		const char *argv[2] = {"SELECT", database};

		snprintf(database, sizeof(database), "%d", url->database);
		resp_append_command(out, 2, argv);
		commands++;
	}
	/* What a sentinel names may have been demoted since: only the master is used. */
	if (url->nsentinels > 0)
	{
		const char *argv[1] = {"ROLE"};

		resp_append_command(out, 1, argv);
		result.role_reply = commands++;
	}
	if (commands == 0)
		return true;
	if (!connection_exchange(node, commands, deadline, 0, handshake_reply, &result, failure))
	{
		failure->maybe_ran = false;
		return false;
	}
	if (result.refused)
	{
		*failure = result.failure;
		redis_disconnect(connection_of(node));
		return false;
	}
	return true;
}

/* Remembers the node connected to, as rl_health shows it (no user, no password). */
static void
note_node(RedisConnection *connection, const RedisEndpoint *endpoint, const RedisUrl *url)
{
	if (endpoint->path != NULL)
		snprintf(connection->node, sizeof(connection->node), "unix:%s", endpoint->path);
	else
		snprintf(connection->node, sizeof(connection->node),
				 strchr(endpoint->host, ':') ? "[%s]:%d%s" : "%s:%d%s", endpoint->host,
				 endpoint->port, url->nsentinels > 0 ? " (master of the sentinels)" : "");
}

/*
 * Opens the connection to node: for node 0, the one ratelimit.redis_url
 * names (the master of a Sentinel URL found first), for others the cluster
 * node; then AUTH, SELECT (and ROLE), each step within connect_timeout (and
 * deadline, when not 0).
 */
static bool
redis_connect(int node, int64 deadline, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);
	const char *current = redis_url_current();
	RedisUrl	url;
	RedisEndpoint endpoint = {0};
	const char *problem;
	const char *password;
	int64		connect_deadline;

	if (current[0] == '\0')
		return redis_fail(failure, REDIS_FAILURE_CONFIG, secret_url_problem() ? secret_url_problem() :
						  "ratelimit.redis_url is not set");
	if (!redis_url_parse(current, &url, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is invalid");
	/*
	 * The URL's password, else the one in ratelimit.redis_password_file: this
	 * server's Redis's, never sent to a region's (whose URL says its own).
	 */
	password = url.password;
	if (password == NULL && redis_url_target() == 0 && !secret_redis_password(&password, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, problem);

	exchange_reset();
	/* Busy from here: a cancel while connecting leaves it to be closed at abort. */
	connection->busy = true;
	connection->node[0] = '\0';
	connection->sentinel = url.nsentinels > 0;
	connection->sent_script_count = 0;
	if (connection->sentinel)
	{
		RedisHostPort master;

		if (!sentinel_find_master(&url, deadline_connect_timeout_ms, deadline, &master, failure))
		{
			connection->busy = false;
			return false;
		}
		url.host = master.host;
		url.port = master.port;
		strlcpy(connection->master_host, master.host, sizeof(connection->master_host));
		connection->master_port = master.port;
		connection->next_check_us = clock_monotonic_us() + (int64) sentinel_check_interval_ms * 1000;
	}
	else if (url.nseeds > 0)
	{
		const char *host;

		/* A cluster node, or one of the URL's. */
		if (!cluster_node_address(node, &host, &url.port))
		{
			connection->busy = false;
			return redis_fail(failure, REDIS_FAILURE_CONFIG, "the cluster node has no address");
		}
		url.host = (char *) host;
	}
	endpoint.path = url.path;
	endpoint.host = url.host;
	endpoint.port = url.port;
	if (!stream_open(&connection->stream, &endpoint, url.tls, deadline_connect_timeout_ms,
					 deadline, &connect_deadline, failure))
	{
		connection->busy = false;
		return false;
	}
	if (!redis_handshake(node, &url, password, connect_deadline, failure))
		return false;

	note_node(connection, &endpoint, &url);
	connection->tls_generation = tls_settings_generation();
	connection->epoch = cluster_epoch();
	connection->url = MemoryContextStrdup(TopMemoryContext, current);
	connection->busy = false;
	return true;
}

/*
 * True when the open connection can carry a request: none was cut off on it,
 * it was opened for the current URL and TLS settings, and Redis has not
 * closed it meanwhile. Closes it otherwise.
 */
static bool
redis_connection_usable(RedisConnection *connection)
{
	if (!stream_is_open(&connection->stream))
		return false;
	if (!connection->busy && connection->url != NULL &&
		connection->epoch == cluster_epoch() &&
		strcmp(connection->url, redis_url_current()) == 0 &&
		connection->tls_generation == tls_settings_generation() &&
		stream_idle_and_open(&connection->stream))
		return true;
	redis_disconnect(connection);
	return false;
}

/*
 * For a connection found through Sentinel, every sentinel_check_interval:
 * true when the sentinels name another master now. A failover leaves the old
 * master accepting writes until the sentinels demote it, and those writes
 * would be lost: once the sentinels name another, it is not used again. When
 * no sentinel answers (within command_timeout), the node stays in use.
 */
static bool
master_moved(RedisConnection *connection, int64 deadline)
{
	int64		now = clock_monotonic_us();
	RedisUrl	url;
	RedisHostPort master;
	RedisFailure failure = {0};
	const char *problem;
	int64		check_deadline;

	if (!connection->sentinel || now < connection->next_check_us)
		return false;
	connection->next_check_us = now + (int64) sentinel_check_interval_ms * 1000;
	if (!redis_url_parse(redis_url_current(), &url, &problem) || url.nsentinels == 0)
		return false;
	check_deadline = now + (int64) deadline_command_timeout_ms * 1000;
	if (deadline != 0)
		check_deadline = Min(check_deadline, deadline);
	if (!sentinel_find_master(&url, deadline_command_timeout_ms, check_deadline, &master, &failure))
		return false;
	return strcmp(master.host, connection->master_host) != 0 ||
		master.port != connection->master_port;
}

/*
 * A request cut off by an error (a cancel, a statement timeout) leaves the
 * connection busy: it is closed when the transaction aborts, rather than kept
 * open to a server that may still be sending.
 */
static void
redis_xact_callback(XactEvent event, void *arg)
{
	if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT)
		return;
	for (int target = 0; target < REDIS_MAX_TARGETS; target++)
		for (int node = 0; node < REDIS_MAX_NODES; node++)
		{
			RedisConnection *connection = target_connections[target][node];

			if (connection != NULL && stream_is_open(&connection->stream) && connection->busy)
				redis_disconnect(connection);
		}
}

/*
 * Defines ratelimit.sentinel_check_interval and registers the transaction
 * callback; called once per process from _PG_init.
 */
void
connection_init(void)
{
	DefineCustomIntVariable("ratelimit.sentinel_check_interval",
							"How often a connection found through Sentinel asks the sentinels whether its node is still the master.",
							"After a failover the old master takes writes until it is demoted; they would be lost.",
							&sentinel_check_interval_ms, 1000, 10, 3600 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	RegisterXactCallback(redis_xact_callback, NULL);
}

/*
 * Makes node's connection ready for a request: the open one when it is
 * usable, else a new one (connect_timeout, and deadline when not 0, bound
 * opening it); *opened says which. False, saying why in failure, when it
 * cannot be opened.
 */
bool
connection_open(int node, int64 deadline, bool *opened, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);

	*opened = false;
	if (redis_connection_usable(connection))
	{
		if (!master_moved(connection, deadline))
			return true;
		redis_disconnect(connection);
	}
	if (!redis_connect(node, deadline, failure))
	{
		socket_forget_address();
		return false;
	}
	*opened = true;
	return true;
}

/*
 * Closes the idle connections opened before the nodes started again (another
 * URL): their indexes may never be used again, and would keep their sockets.
 */
void
connection_close_stale(void)
{
	static uint32 checked_epochs[REDIS_MAX_TARGETS];
	uint32		checked_epoch = cluster_epoch();

	if (checked_epochs[redis_url_target()] == checked_epoch)
		return;
	checked_epochs[redis_url_target()] = checked_epoch;
	for (int node = 0; node < REDIS_MAX_NODES; node++)
		if (connections[node] != NULL && stream_is_open(&connections[node]->stream) &&
			!connections[node]->busy && connections[node]->epoch != checked_epoch)
			redis_disconnect(connections[node]);
}

/* Where the commands of the next exchange are written (resp_append_command). */
StringInfo
connection_output(void)
{
	return exchange_output();
}

/*
 * A request starts on node: until connection_done, a connection cut off is
 * not to be reused.
 */
void
connection_begin(int node)
{
	connection_of(node)->busy = true;
}

/* The request is complete: node's connection may carry another. */
void
connection_done(int node)
{
	connection_of(node)->busy = false;
}

/* Closes node's idle connection now: the node cannot serve, the next call connects anew. */
void
connection_discard(int node)
{
	RedisConnection *connection = connection_of(node);

	if (stream_is_open(&connection->stream) && !connection->busy)
	{
		redis_disconnect(connection);
		socket_forget_address();
	}
}

/*
 * True when node's connection has sent script already (Redis most likely has
 * it cached); else notes that it is being sent now, when there is room.
 */
bool
connection_script_sent(int node, const LuaScript *script)
{
	RedisConnection *connection = connection_of(node);

	for (int i = 0; i < connection->sent_script_count; i++)
		if (connection->sent_scripts[i] == script)
			return true;
	if (connection->sent_script_count < SENT_SCRIPTS_MAX)
		connection->sent_scripts[connection->sent_script_count++] = script;
	return false;
}

/* The node a connection is to (for rl_health), or "" when none is open. */
const char *
connection_node(int node)
{
	if (node < 0 || node >= REDIS_MAX_NODES || connections[node] == NULL ||
		!stream_is_open(&connections[node]->stream))
		return "";
	return connections[node]->node;
}
