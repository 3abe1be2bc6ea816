/*
 * node_connections.c
 *	  A backend's way to each Redis node: its own connection (connection.c),
 *	  opened lazily; or, with ratelimit.redis_connections = shared, the
 *	  server's one connection to the node, kept by a worker (handoff.c).
 *
 * The nodes are cluster.c's: node 0 is the URL's (for a Sentinel URL, the
 * master its sentinels name), the others the nodes of a Redis Cluster, each
 * reached with the URL's TLS, user and password. Requests go through
 * exchange.c, one deadline each; pipeline.c says what to send.
 *
 * A shared connection takes exchanges of up to HANDOFF_REQUEST_MAX bytes of
 * commands; a larger one (a batch of hundreds of calls, which is one write
 * anyway), or one that asks again after a reply too large to hand back, goes
 * on a connection of the backend's own, closed after it. A node no worker can
 * be started for is reached on the backend's own, kept.
 */
#include "prelude.h"

#include "access/xact.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/exchange.h"
#include "redis/handoff.h"
#include "redis/tls.h"
#include "redis/url.h"

/* Per target (url.h), allocated as nodes are first used. */
static void redis_xact_callback(XactEvent event, void *arg);

static RedisConnection *target_connections[REDIS_MAX_TARGETS][REDIS_MAX_NODES];

/* The connections of the target in use. */
#define connections (target_connections[redis_url_target()])

/* The connection of a node, allocated (closed) the first time. */
static RedisConnection *
connection_of(int node)
{
	static bool registered = false;

	Assert(node >= 0 && node < REDIS_MAX_NODES);
	if (!registered)
		RegisterXactCallback(redis_xact_callback, NULL);
	registered = true;
	if (connections[node] == NULL)
		connections[node] = connection_create();
	return connections[node];
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

/*
 * Where node is, for a connection to it: host and port of a cluster node (or
 * of one of the URL's), or NULL host for the URL's own (a unix socket, or a
 * Sentinel URL's master). False, saying why, when it has no address.
 */
static bool
node_address(int node, const char *url_text, const char **host, int *port,
			 RedisFailure *failure)
{
	RedisUrl	url;
	const char *problem;

	*host = NULL;
	*port = 0;
	if (url_text[0] == '\0' || !redis_url_parse(url_text, &url, &problem) ||
		url.nsentinels > 0 || url.nseeds == 0)
		return true;			/* connection_connect says what is wrong, if anything */
	if (!cluster_node_address(node, host, port))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, "the cluster node has no address");
	return true;
}

/* Opens this backend's own connection to node, with the URL in use. */
static bool
redis_connect(int node, int64 deadline, RedisFailure *failure)
{
	const char *current = redis_url_current();
	const char *host;
	int			port;

	if (!node_address(node, current, &host, &port, failure))
		return false;
	return connection_connect(connection_of(node), current, redis_url_target(), host, port,
							  deadline, failure);
}

/*
 * True when node's open connection can carry a request for the URL in use,
 * opened since the cluster's nodes last changed; else it is closed.
 */
static bool
redis_connection_usable(RedisConnection *connection, int64 deadline)
{
	if (stream_is_open(&connection->stream) && connection->epoch != cluster_epoch())
		connection_close(connection);
	return connection_ready(connection, redis_url_current(), CONNECTION_IDLE_CHECK_US, deadline);
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
				connection_close(connection);
		}
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
	/* Shared: the worker opens the connection; the exchange says how that went. */
	if (handoff_enabled())
		return true;
	if (redis_connection_usable(connection, deadline))
		return true;
	if (!redis_connect(node, deadline, failure))
	{
		socket_forget_address();
		return false;
	}
	*opened = true;
	return true;
}

/*
 * Hands node's exchange to the server's shared connection to it (handoff.c),
 * the node named as the worker connects to it: the URL in use and the
 * node's address, found again only when the URL or the cluster's nodes change.
 */
static HandoffOutcome
shared_exchange(int node, int nreplies, int64 deadline, int64 idle_us,
				ExchangeReplyHandler handler, void *arg, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);
	const char *current = redis_url_current();
	HandoffNode where;
	HandoffOutcome outcome;
	uint64		generation = connection->shared_generation;

	/*
	 * A reply too large to hand back (a Cluster's slot map of many ranges): the
	 * calls that came with it had their answers; the exchange that asks again
	 * goes on the backend's own connection.
	 */
	if (connection->shared_too_large)
	{
		connection->shared_too_large = false;
		return HANDOFF_TOO_LARGE;
	}
	if (connection->shared_url == NULL || connection->shared_epoch != cluster_epoch() ||
		strcmp(connection->shared_url, current) != 0)
	{
		const char *host;

		if (connection->shared_url != NULL)
			pfree(connection->shared_url);
		connection->shared_url = NULL;
		if (!node_address(node, current, &host, &connection->shared_port, failure))
			return HANDOFF_FAILED;
		connection->shared_host = NULL;
		if (host != NULL)
		{
			strlcpy(connection->shared_host_buffer, host, sizeof(connection->shared_host_buffer));
			connection->shared_host = connection->shared_host_buffer;
		}
		connection->shared_epoch = cluster_epoch();
		connection->shared_url = MemoryContextStrdup(TopMemoryContext, current);
	}
	where.url = current;
	where.tls = tls_settings_text();
	where.target = redis_url_target();
	where.host = connection->shared_host;
	where.port = connection->shared_port;
	outcome = handoff_exchange(&where, exchange_output(), nreplies, deadline, idle_us, handler,
							   arg, &connection->shared_channel, &generation, failure);
	if (outcome == HANDOFF_NONE || outcome == HANDOFF_TOO_LARGE)
		return outcome;			/* the commands stay, for the backend's own connection */
	exchange_reset();
	connection->shared_too_large = outcome == HANDOFF_FAILED &&
		failure->kind == REDIS_FAILURE_PROTOCOL && strcmp(failure->detail, HANDOFF_REPLY_TOO_LARGE) == 0;
	/* Another connection of the worker: the scripts it has are not known. */
	if (outcome == HANDOFF_DONE && generation != connection->shared_generation)
	{
		connection->sent_script_count = 0;
		connection->shared_generation = generation;
	}
	return outcome;
}

/*
 * Opens this backend's own connection to node for an exchange whose commands
 * are written already (connecting writes its own): one the shared
 * connection could not take.
 */
static bool
own_connection(int node, int64 deadline, bool *opened, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);
	StringInfoData commands;
	bool		ok;

	initStringInfo(&commands);
	appendBinaryStringInfo(&commands, exchange_output()->data, exchange_output()->len);
	*opened = !redis_connection_usable(connection, deadline);
	ok = !*opened || redis_connect(node, deadline, failure);
	resetStringInfo(exchange_output());
	appendBinaryStringInfo(exchange_output(), commands.data, commands.len);
	pfree(commands.data);
	if (!ok)
	{
		failure->new_connection = true;
		socket_forget_address();
	}
	connection->busy = ok;
	return ok;
}

/*
 * Runs an exchange with node: on the shared connection to it when this server
 * uses them (and it can take it), else on the backend's own. On failure the
 * own connection, whose state is now unknown, is closed, and the resolved
 * address goes too: after a failover the name may point elsewhere.
 */
bool
connection_exchange(int node, int nreplies, int64 deadline, int64 idle_us, ExchangeReplyHandler handler,
					void *arg, RedisFailure *failure)
{
	RedisConnection *connection = connection_of(node);
	bool		once = false;	/* beside the shared connections, its own for this exchange alone */
	bool		opened = false;
	bool		ok;

	if (handoff_enabled())
	{
		switch (shared_exchange(node, nreplies, deadline, idle_us, handler, arg, failure))
		{
			case HANDOFF_DONE:
				return true;
			case HANDOFF_FAILED:
				return false;
			case HANDOFF_TOO_LARGE:
				once = true;
				break;
			case HANDOFF_NONE:
				break;			/* none to hand it to: its own, kept for the next */
		}
		if (!own_connection(node, deadline, &opened, failure))
			return false;
	}
	Assert(stream_is_open(&connection->stream) && connection->busy);
	ok = connection_run(connection, nreplies, deadline, idle_us, handler, arg, failure);
	if (!ok)
	{
		failure->new_connection |= opened;
		socket_forget_address();
	}
	else if (once)
		connection_close(connection);
	return ok;
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
			connection_close(connections[node]);
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
	/* Commands a cancel left unsent (handed off, nothing closes them): never sent now. */
	if (handoff_enabled())
		exchange_reset();
	connection_of(node)->busy = true;
}

/* The request is complete: node's connection may carry another. */
void
connection_done(int node)
{
	RedisConnection *connection = connection_of(node);

	connection->busy = false;
	connection->last_used_us = clock_monotonic_us();
}

/* Closes node's idle connection now: the node cannot serve, the next call connects anew. */
void
connection_discard(int node)
{
	RedisConnection *connection = connection_of(node);

	if (handoff_enabled() && connection->shared_channel >= 0)
		handoff_discard(connection->shared_channel, connection->shared_generation);
	if (stream_is_open(&connection->stream) && !connection->busy)
	{
		connection_close(connection);
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
	static char shared_node[300];

	if (node < 0 || node >= REDIS_MAX_NODES || connections[node] == NULL)
		return "";
	if (handoff_enabled() && connections[node]->shared_channel >= 0)
	{
		handoff_node(connections[node]->shared_channel, shared_node, sizeof(shared_node));
		return shared_node;
	}
	if (!stream_is_open(&connections[node]->stream))
		return "";
	return connections[node]->node;
}

