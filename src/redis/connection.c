/*
 * connection.c
 *	  One Redis connection per backend, opened lazily, used without ever blocking.
 *
 * The socket (socket.c) is non-blocking and every wait serves interrupts; each
 * exchange has one deadline. Commands are written and replies read by resp.c,
 * which bounds what a reply may make the backend hold; pipeline.c says what to
 * send. Opening a connection is connecting, then AUTH and SELECT as the URL asks.
 *
 * A connection whose request was cut off (deadline, error, interrupt) is
 * closed, never reused: it might still deliver the old answer. An idle
 * connection that Redis closed meanwhile (a restart, a timeout, CLIENT KILL)
 * is noticed before the request is written and opened again within the same
 * call; only a request that Redis may have run goes to the fail mode.
 */
#include "prelude.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/secret.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/socket.h"
#include "redis/url.h"

/* Bytes read from the socket at once. */
#define REDIS_READ_CHUNK 16384
/* A buffer grown past this by a large pipeline is freed after use. */
#define REDIS_BUFFER_KEEP 65536

typedef struct RedisConnection
{
	char	   *url;			/* the ratelimit.redis_url it was opened with */
	bool		busy;			/* a request is under way (or was cut off) */
	StringInfoData output;		/* commands to send; output_sent bytes of them are sent */
	int			output_sent;
	StringInfoData input;		/* bytes received; from input_start on, not yet read */
	int			input_start;
} RedisConnection;

static RedisConnection connection = {0};
static MemoryContext redis_context = NULL;

/* Empties the buffers, and gives back the memory of any that a large pipeline grew. */
static void
redis_reset_buffers(void)
{
	if (redis_context == NULL)
		redis_context = AllocSetContextCreate(TopMemoryContext, "ratelimit redis",
											  ALLOCSET_SMALL_SIZES);
	if (connection.output.data == NULL || connection.output.maxlen > REDIS_BUFFER_KEEP ||
		connection.input.maxlen > REDIS_BUFFER_KEEP)
	{
		MemoryContext old_context = MemoryContextSwitchTo(redis_context);

		if (connection.output.data != NULL)
		{
			pfree(connection.output.data);
			pfree(connection.input.data);
		}
		initStringInfo(&connection.output);
		initStringInfo(&connection.input);
		MemoryContextSwitchTo(old_context);
	}
	resetStringInfo(&connection.output);
	resetStringInfo(&connection.input);
	connection.output_sent = 0;
	connection.input_start = 0;
}

/* Closes the connection and frees everything it holds. */
static void
redis_disconnect(void)
{
	socket_close();
	if (connection.url != NULL)
		pfree(connection.url);
	connection.url = NULL;
	connection.busy = false;
	redis_reset_buffers();
}

/*
 * Like redis_fail(), and closes the connection, whose state is now unknown. The
 * resolved address goes too: after a failover the name may point elsewhere.
 */
static bool
fail_and_disconnect(RedisFailure *failure, RedisFailureKind kind, const char *detail)
{
	redis_fail(failure, kind, detail);
	redis_disconnect();
	socket_forget_address();
	return false;
}

/* Sends what the socket takes of the pending output; false (disconnected) on an error. */
static bool
redis_send(RedisFailure *failure)
{
	while (connection.output_sent < connection.output.len)
	{
		ssize_t		sent = socket_send(connection.output.data + connection.output_sent,
									   connection.output.len - connection.output_sent);

		if (sent > 0)
			connection.output_sent += sent;
		else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return true;
		else
		{
			failure->maybe_ran = connection.output_sent > 0;
			return fail_and_disconnect(failure, REDIS_FAILURE_IO, "write failed");
		}
	}
	return true;
}

/* Reads what the socket has into the input buffer; false (disconnected) on end or error. */
static bool
redis_receive(RedisFailure *failure)
{
	StringInfo	input = &connection.input;
	ssize_t		received;

	/* What was read already goes; what is left (part of a reply) moves to the front. */
	if (connection.input_start > 0)
	{
		memmove(input->data, input->data + connection.input_start,
				input->len - connection.input_start);
		input->len -= connection.input_start;
		input->data[input->len] = '\0';
		connection.input_start = 0;
	}
	enlargeStringInfo(input, REDIS_READ_CHUNK);
	received = socket_receive(input->data + input->len, REDIS_READ_CHUNK);
	if (received > 0)
	{
		input->len += received;
		input->data[input->len] = '\0';
		return true;
	}
	if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return true;
	failure->maybe_ran = connection.output_sent > 0;
	return fail_and_disconnect(failure, REDIS_FAILURE_IO,
							   received == 0 ? "connection closed" : "read failed");
}

/*
 * Sends the pending output and reads nreplies replies, handing each to handler
 * as it is complete; one deadline for it all. False (disconnected) when the
 * exchange could not be completed.
 */
bool
connection_exchange(int nreplies, int64 deadline, ConnectionReplyHandler handler, void *arg,
					RedisFailure *failure)
{
	int			received = 0;
	RespScanner scanner;

	Assert(socket_is_open() && connection.busy);
	resp_scanner_start(&scanner);
	for (;;)
	{
		uint32		events;
		uint32		occurred;

		if (!redis_send(failure))
			return false;
		while (received < nreplies)
		{
			const char *start = connection.input.data + connection.input_start;
			size_t		length;
			RespValue	reply;

			switch (resp_scan(&scanner, start, connection.input.len - connection.input_start,
							  &length))
			{
				case RESP_INCOMPLETE:
					break;
				case RESP_COMPLETE:
					resp_read(start, &reply);
					handler(received++, &reply, arg);
					connection.input_start += length;
					resp_scanner_start(&scanner);
					continue;
				case RESP_MALFORMED:
					failure->maybe_ran = true;
					return fail_and_disconnect(failure, REDIS_FAILURE_PROTOCOL, "malformed reply");
				case RESP_TOO_LARGE:
					failure->maybe_ran = true;
					return fail_and_disconnect(failure, REDIS_FAILURE_PROTOCOL, "reply too large");
			}
			break;
		}
		if (received == nreplies)
		{
			redis_reset_buffers();
			return true;
		}
		events = WL_SOCKET_READABLE;
		if (connection.output_sent < connection.output.len)
			events |= WL_SOCKET_WRITEABLE;
		occurred = socket_wait(events, deadline);
		if (occurred == 0)
		{
			failure->maybe_ran = connection.output_sent > 0;
			return fail_and_disconnect(failure, REDIS_FAILURE_TIMEOUT,
									   ProcDiePending ? "backend terminating" : "no answer in time");
		}
		if ((occurred & WL_SOCKET_READABLE) && !redis_receive(failure))
			return false;
	}
}

/* The first error reply of a handshake, for redis_handshake. */
typedef struct HandshakeResult
{
	bool		refused;
	RedisFailure failure;
} HandshakeResult;

static void
handshake_reply(int index, const RespValue *reply, void *arg)
{
	HandshakeResult *result = arg;

	if (reply->type == RESP_ERROR && !result->refused)
	{
		result->refused = true;
		redis_fail_with_error(&result->failure, reply->str, reply->length);
		if (result->failure.kind == REDIS_FAILURE_REPLY)
			result->failure.kind = REDIS_FAILURE_CONNECT;
	}
}

/* Sends AUTH and SELECT, as the URL asks, in one round trip. */
static bool
redis_handshake(const RedisUrl *url, const char *password, int64 deadline, RedisFailure *failure)
{
	HandshakeResult result = {0};
	int			commands = 0;

	if (password != NULL)
	{
		const char *argv[3] = {"AUTH"};
		int			argc = 1;

		if (url->user != NULL)
			argv[argc++] = url->user;
		argv[argc++] = password;
		resp_append_command(&connection.output, argc, argv);
		commands++;
	}
	if (url->database != 0)
	{
		char		database[16];
		const char *argv[2] = {"SELECT", database};

		snprintf(database, sizeof(database), "%d", url->database);
		resp_append_command(&connection.output, 2, argv);
		commands++;
	}
	if (commands == 0)
		return true;
	if (!connection_exchange(commands, deadline, handshake_reply, &result, failure))
	{
		failure->maybe_ran = false;
		return false;
	}
	if (result.refused)
	{
		*failure = result.failure;
		redis_disconnect();
		return false;
	}
	return true;
}

/*
 * Opens the connection named by ratelimit.redis_url, with AUTH and SELECT,
 * within connect_timeout (and deadline, when not 0).
 */
static bool
redis_connect(int64 deadline, RedisFailure *failure)
{
	const char *current = redis_url_current();
	RedisUrl	url;
	const char *problem;
	const char *password;
	int64		connect_deadline;

	if (current[0] == '\0')
		return redis_fail(failure, REDIS_FAILURE_CONFIG, secret_url_problem() ? secret_url_problem() :
						  "ratelimit.redis_url is not set");
	if (!redis_url_parse(current, &url, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is invalid");
	/* The URL's password, else the one in ratelimit.redis_password_file. */
	password = url.password;
	if (password == NULL && !secret_redis_password(&password, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, problem);

	redis_reset_buffers();
	/* Busy from here: a cancel while connecting leaves it to be closed at abort. */
	connection.busy = true;
	if (!socket_open(&url, deadline_connect_timeout_ms, deadline, &connect_deadline, failure))
	{
		connection.busy = false;
		return false;
	}
	if (!redis_handshake(&url, password, connect_deadline, failure))
		return false;

	connection.url = MemoryContextStrdup(TopMemoryContext, current);
	connection.busy = false;
	return true;
}

/*
 * True when the open connection can carry a request: none was cut off on it,
 * it was opened for the current URL, and Redis has not closed it meanwhile (an
 * idle connection has nothing to read; end of file or stray bytes mean it is
 * gone). Closes it otherwise.
 */
static bool
redis_connection_usable(void)
{
	if (!socket_is_open())
		return false;
	if (!connection.busy && connection.url != NULL &&
		strcmp(connection.url, redis_url_current()) == 0 &&
		socket_idle_and_open())
		return true;
	redis_disconnect();
	return false;
}

/*
 * A request cut off by an error (a cancel, a statement timeout) leaves the
 * connection busy: it is closed when the transaction aborts, rather than kept
 * open to a server that may still be sending.
 */
static void
redis_xact_callback(XactEvent event, void *arg)
{
	if ((event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) &&
		socket_is_open() && connection.busy)
		redis_disconnect();
}

/* Registers the transaction callback; called once per process from _PG_init. */
void
connection_init(void)
{
	RegisterXactCallback(redis_xact_callback, NULL);
}

/*
 * Makes the connection ready for a request: the open one when it is usable,
 * else a new one (connect_timeout, and deadline when not 0, bound opening it);
 * *opened says which. False, saying why in failure, when it cannot be opened.
 */
bool
connection_open(int64 deadline, bool *opened, RedisFailure *failure)
{
	*opened = false;
	if (redis_connection_usable())
		return true;
	if (!redis_connect(deadline, failure))
	{
		socket_forget_address();
		return false;
	}
	*opened = true;
	return true;
}

/* Where the commands of the next exchange are written (resp_append_command). */
StringInfo
connection_output(void)
{
	return &connection.output;
}

/*
 * A request starts: until connection_done, a connection cut off is not to be
 * reused.
 */
void
connection_begin(void)
{
	connection.busy = true;
}

/* The request is complete: the connection may carry another. */
void
connection_done(void)
{
	connection.busy = false;
}

