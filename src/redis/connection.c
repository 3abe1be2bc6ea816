/*
 * connection.c
 *	  One Redis connection: opened, checked before use, run, closed, never
 *	  blocking. A backend keeps one per node (node_connections.c); with
 *	  ratelimit.redis_connections = shared, a worker keeps the server's one
 *	  (worker.c).
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

#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/secret.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/exchange.h"
#include "redis/handoff.h"
#include "redis/sentinel.h"
#include "redis/stream.h"
#include "redis/tls.h"
#include "redis/url.h"




/* How often a connection found through Sentinel checks that its node is still the master. */
static int	sentinel_check_interval_ms = 1000;

/* A new connection, closed (a worker's, or a backend's for a node). */
RedisConnection *
connection_create(void)
{
	RedisStream closed = REDIS_STREAM_CLOSED;
	RedisConnection *connection = MemoryContextAllocZero(TopMemoryContext,
														 sizeof(RedisConnection));

	connection->stream = closed;
	connection->shared_channel = -1;
	return connection;
}

/* Closes a connection and frees everything it holds. */
void
connection_close(RedisConnection *connection)
{
	stream_close(&connection->stream);
	if (connection->url != NULL)
		pfree(connection->url);
	connection->url = NULL;
	connection->busy = false;
	connection->untrusted = false;
	connection->sent_script_count = 0;
	exchange_reset();
}

/*
 * Runs an exchange on the connection, open and busy. On failure the
 * connection, whose state is now unknown, is closed.
 */
bool
connection_run(RedisConnection *connection, int nreplies, int64 deadline, int64 idle_us,
			   ExchangeReplyHandler handler, void *arg, RedisFailure *failure)
{
	Assert(stream_is_open(&connection->stream));
	if (exchange_run(&connection->stream, nreplies, deadline, idle_us, handler, arg, failure))
	{
		connection->untrusted |= exchange_left_over();
		connection->last_used_us = clock_monotonic_us();
		return true;
	}
	connection_close(connection);
	return false;
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
redis_handshake(RedisConnection *connection, const RedisUrl *url, const char *password,
				int64 deadline, RedisFailure *failure)
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
	if (!exchange_run(&connection->stream, commands, deadline, 0, handshake_reply, &result,
					  failure))
	{
		connection_close(connection);
		failure->maybe_ran = false;
		return false;
	}
	if (result.refused)
	{
		*failure = result.failure;
		connection_close(connection);
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
 * Opens connection with url (a target's: 0 this server's, whose password may
 * come from ratelimit.redis_password_file) to host and port, or when host is
 * NULL to the URL's own node (a Sentinel URL's master, found first); then
 * AUTH, SELECT (and ROLE), each step within connect_timeout (and deadline,
 * when not 0). Backends open theirs so; a shared connection's worker too.
 */
bool
connection_connect(RedisConnection *connection, const char *url_text, int target,
				   const char *host, int port, int64 deadline, RedisFailure *failure)
{
	RedisUrl	url;
	RedisEndpoint endpoint = {0};
	const char *problem;
	const char *password;
	int64		connect_deadline;

	if (url_text[0] == '\0')
		return redis_fail(failure, REDIS_FAILURE_CONFIG, secret_url_problem() ? secret_url_problem() :
						  "ratelimit.redis_url is not set");
	if (!redis_url_parse(url_text, &url, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is invalid");
	/*
	 * The URL's password, else the one in ratelimit.redis_password_file: this
	 * server's Redis's, never sent to a region's (whose URL says its own).
	 */
	password = url.password;
	if (password == NULL && target == 0 && !secret_redis_password(&password, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, problem);

	connection_close(connection);
	/* Busy from here: a cancel while connecting leaves it to be closed at abort. */
	connection->busy = true;
	connection->node[0] = '\0';
	connection->sentinel = url.nsentinels > 0;
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
	else if (host != NULL)
	{
		url.host = (char *) host;
		url.port = port;
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
	if (!redis_handshake(connection, &url, password, connect_deadline, failure))
		return false;

	note_node(connection, &endpoint, &url);
	connection->tls_generation = tls_settings_generation();
	connection->epoch = cluster_epoch();
	connection->url = MemoryContextStrdup(TopMemoryContext, url_text);
	connection->busy = false;
	return true;
}

/*
 * True when the open connection can carry a request: none was cut off on it,
 * it was opened for the current URL and TLS settings, and Redis has not
 * closed it meanwhile. Closes it otherwise.
 */
static bool
usable_for(RedisConnection *connection, const char *url, int64 check_idle_us)
{
	if (!stream_is_open(&connection->stream))
		return false;
	if (!connection->busy && !connection->untrusted && connection->url != NULL &&
		strcmp(connection->url, url) == 0 &&
		connection->tls_generation == tls_settings_generation() &&
		(clock_monotonic_us() - connection->last_used_us < check_idle_us ||
		 stream_idle_and_open(&connection->stream)))
		return true;
	connection_close(connection);
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
master_moved(RedisConnection *connection, const char *url_text, int64 deadline)
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
	if (!redis_url_parse(url_text, &url, &problem) || url.nsentinels == 0)
		return false;
	check_deadline = now + (int64) deadline_command_timeout_ms * 1000;
	if (deadline != 0)
		check_deadline = Min(check_deadline, deadline);
	if (!sentinel_find_master(&url, deadline_command_timeout_ms, check_deadline, &master, &failure))
		return false;
	return strcmp(master.host, connection->master_host) != 0 ||
		master.port != connection->master_port;
}

/* Defines ratelimit.sentinel_check_interval and ratelimit.redis_connections (handoff.c). */
void
connection_init(void)
{
	DefineCustomIntVariable("ratelimit.sentinel_check_interval",
							"How often a connection found through Sentinel asks the sentinels whether its node is still the master.",
							"After a failover the old master takes writes until it is demoted; they would be lost.",
							&sentinel_check_interval_ms, 1000, 10, 3600 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	handoff_init();
}

/*
 * A worker's connection (worker.c): true when it can carry the next request
 * for url (a Sentinel URL's node still the master); else it is closed.
 */
bool
connection_ready(RedisConnection *connection, const char *url, int64 check_idle_us,
				 int64 deadline)
{
	if (usable_for(connection, url, check_idle_us) && !master_moved(connection, url, deadline))
		return true;
	connection_close(connection);
	return false;
}


/* The node an open connection is to, as rl_health shows it. */
const char *
connection_address(const RedisConnection *connection)
{
	return connection->node;
}
