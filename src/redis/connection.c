/*
 * redis.c
 *	  One Redis connection per backend, opened lazily, used without ever blocking.
 *
 * The socket is non-blocking, and every wait goes through a WaitEventSet that
 * also wakes on the latch (so cancel and statement_timeout work while Redis is
 * silent) and exits on postmaster death. Each call has one deadline. Commands
 * are written and replies read by resp.c, which bounds what a reply may make
 * the backend hold. Several script calls can go out as one pipeline: one write,
 * one round trip, one deadline for them all.
 *
 * A connection whose request was cut off (deadline, error, interrupt) is
 * closed, never reused: it might still deliver the old answer. An idle
 * connection that Redis closed meanwhile (a restart, a timeout, CLIENT KILL)
 * is noticed before the request is written and opened again within the same
 * call; only a request that Redis may have run goes to the fail mode.
 */
#include "ratelimit.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "access/xact.h"
#include "common/cryptohash.h"
#include "common/sha1.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 170000
#include "utils/wait_event.h"
#endif

#include "redis.h"
#include "redis_url.h"
#include "resp.h"
#include "secret.h"

/* Bytes read from the socket at once. */
#define REDIS_READ_CHUNK 16384
/* A buffer grown past this by a large pipeline is freed after use. */
#define REDIS_BUFFER_KEEP 65536

typedef struct RedisConnection
{
	pgsocket	sock;			/* PGINVALID_SOCKET: not connected */
	WaitEventSet *wait_set;
	int			socket_event;	/* position of the socket in wait_set */
	char	   *url;			/* the ratelimit.redis_url it was opened with */
	bool		busy;			/* a request is under way (or was cut off) */
	StringInfoData output;		/* commands to send; output_sent bytes of them are sent */
	int			output_sent;
	StringInfoData input;		/* bytes received; from input_start on, not yet read */
	int			input_start;
} RedisConnection;

static RedisConnection connection = {.sock = PGINVALID_SOCKET};
static MemoryContext redis_context = NULL;

int64		redis_last_round_trip_us = -1;

/* The address a host name resolved to, kept until a connect to it fails. */
static char resolved_host[256];
static char resolved_address[INET6_ADDRSTRLEN];

/* Handles one reply of an exchange: index is its place among the replies awaited. */
typedef void (*RedisReplyHandler) (int index, const RespValue *reply, void *arg);

/*
 * The address to connect to for host: host itself when it is an IP literal,
 * else the cached result of resolving it. Resolving blocks (getaddrinfo cannot
 * be interrupted), so it happens once per backend and again only after a
 * connect failed, which the breaker allows at most once per retry_interval.
 * NULL when the name does not resolve.
 */
static const char *
redis_address(const char *host)
{
	unsigned char buffer[sizeof(struct in6_addr)];
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	struct addrinfo *addresses;
	bool		ok;

	if (inet_pton(AF_INET, host, buffer) == 1 || inet_pton(AF_INET6, host, buffer) == 1)
		return host;
	if (strcmp(resolved_host, host) == 0 && resolved_address[0] != '\0')
		return resolved_address;
	/* IPv4 first: "localhost" must not land on a ::1 nobody listens on. */
	if (getaddrinfo(host, NULL, &hints, &addresses) != 0)
	{
		hints.ai_family = AF_INET6;
		if (getaddrinfo(host, NULL, &hints, &addresses) != 0)
			return NULL;
	}
	ok = getnameinfo(addresses->ai_addr, addresses->ai_addrlen, resolved_address,
					 sizeof(resolved_address), NULL, 0, NI_NUMERICHOST) == 0;
	freeaddrinfo(addresses);
	if (!ok)
		return NULL;
	strlcpy(resolved_host, host, sizeof(resolved_host));
	return resolved_address;
}

/* Forgets the resolved address, so that the next connect resolves the name again. */
static void
redis_forget_address(void)
{
	resolved_host[0] = '\0';
	resolved_address[0] = '\0';
}

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
	if (connection.wait_set != NULL)
		FreeWaitEventSet(connection.wait_set);
	connection.wait_set = NULL;
	if (connection.sock != PGINVALID_SOCKET)
	{
		closesocket(connection.sock);
		ReleaseExternalFD();
	}
	connection.sock = PGINVALID_SOCKET;
	if (connection.url != NULL)
		pfree(connection.url);
	connection.url = NULL;
	connection.busy = false;
	redis_reset_buffers();
}

/* Records a failure of the given kind with a short detail. */
static bool
fail(RedisFailure *failure, RedisFailureKind kind, const char *detail)
{
	failure->kind = kind;
	strlcpy(failure->detail, detail ? detail : "", sizeof(failure->detail));
	return false;
}

/*
 * Like fail(), and closes the connection, whose state is now unknown. The
 * resolved address goes too: after a failover the name may point elsewhere.
 */
static bool
fail_and_disconnect(RedisFailure *failure, RedisFailureKind kind, const char *detail)
{
	fail(failure, kind, detail);
	redis_disconnect();
	redis_forget_address();
	return false;
}

/*
 * CHECK_FOR_INTERRUPTS, but a cancel or statement timeout raised here is logged
 * without the statement, which may hold a subject.
 */
static void
redis_check_for_interrupts(void)
{
	MemoryContext context = CurrentMemoryContext;

	if (!INTERRUPTS_PENDING_CONDITION())
		return;
	PG_TRY();
	{
		CHECK_FOR_INTERRUPTS();
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(context);
		error = CopyErrorData();
		FlushErrorState();
		error->hide_stmt = true;
		error->hide_ctx = true;
		ReThrowError(error);
	}
	PG_END_TRY();
}

/*
 * The wait event pg_stat_activity shows while a backend waits for Redis: our
 * own name where PostgreSQL 17 lets extensions name one, "Extension" before.
 */
static uint32
redis_wait_event(void)
{
#if PG_VERSION_NUM >= 170000
	static uint32 event = 0;

	if (event == 0)
		event = WaitEventExtensionNew("RateLimitRedis");
	return event;
#else
	return PG_WAIT_EXTENSION;
#endif
}

/*
 * Waits until the socket is ready for one of events (WL_SOCKET_READABLE,
 * WL_SOCKET_WRITEABLE) or the deadline (rl_monotonic_us time) passes. Returns
 * the events that occurred, 0 on timeout. Interrupts are served while waiting,
 * so a cancel raises its error from here.
 */
static uint32
redis_wait(uint32 events, int64 deadline)
{
	ModifyWaitEvent(connection.wait_set, connection.socket_event, events, NULL);
	for (;;)
	{
		WaitEvent	event;
		int64		now = rl_monotonic_us();
		long		remaining_ms;

		/*
		 * Where interrupts are held (giving back at the end of a transaction),
		 * a terminate cannot be served here: stop waiting, so that it is
		 * served as soon as they are resumed. (At exit it is being served:
		 * what is given back then has its deadline.)
		 */
		if (now >= deadline ||
			(ProcDiePending && InterruptHoldoffCount > 0 && !proc_exit_inprogress))
			return 0;
		remaining_ms = (long) ((deadline - now + 999) / 1000);
		if (WaitEventSetWait(connection.wait_set, remaining_ms, &event, 1,
							 redis_wait_event()) == 0)
			continue;			/* timed out: the check above decides */
		if (event.events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			redis_check_for_interrupts();
			continue;
		}
		if (event.events & events)
			return event.events & events;
	}
}

/* Sends what the socket takes of the pending output; false (disconnected) on an error. */
static bool
redis_send(RedisFailure *failure)
{
	while (connection.output_sent < connection.output.len)
	{
		ssize_t		sent = send(connection.sock, connection.output.data + connection.output_sent,
								connection.output.len - connection.output_sent, MSG_NOSIGNAL);

		if (sent > 0)
			connection.output_sent += sent;
		else if (sent < 0 && errno == EINTR)
			continue;
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
	do
		received = recv(connection.sock, input->data + input->len, REDIS_READ_CHUNK, 0);
	while (received < 0 && errno == EINTR);
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
static bool
redis_exchange(int nreplies, int64 deadline, RedisReplyHandler handler, void *arg,
			   RedisFailure *failure)
{
	int			received = 0;
	RespScanner scanner;

	Assert(connection.sock != PGINVALID_SOCKET && connection.busy);
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
			return true;
		events = WL_SOCKET_READABLE;
		if (connection.output_sent < connection.output.len)
			events |= WL_SOCKET_WRITEABLE;
		occurred = redis_wait(events, deadline);
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

/* True when text[0 .. length) contains needle. */
static bool
contains(const char *text, int length, const char *needle)
{
	int			n = strlen(needle);

	for (int i = 0; i + n <= length; i++)
		if (memcmp(text + i, needle, n) == 0)
			return true;
	return false;
}

/*
 * The command Redis names in a permission error ("... run the 'set' command"),
 * upper-cased into detail, or what was refused when it names none.
 */
static void
permission_detail(const char *text, int length, char *detail, size_t size)
{
	const char *quote = memchr(text, '\'', length);
	const char *close = quote ? memchr(quote + 1, '\'', length - (quote + 1 - text)) : NULL;
	int			n;

	if (quote != NULL && close != NULL && close - quote - 1 < (int) size && close > quote + 1)
	{
		n = close - quote - 1;
		for (int i = 0; i < n; i++)
			detail[i] = pg_toupper((unsigned char) quote[1 + i]);
		detail[n] = '\0';
	}
	else if (contains(text, length, "key"))
		strlcpy(detail, "a key outside the user's key patterns", size);
	else
		strlcpy(detail, "a command the script runs", size);
}

/*
 * Fills failure from an error reply: a permission refusal says which command
 * (NOPERM, or a script's "can't run this command"), any other error its first
 * word ("WRONGTYPE", "OOM", ...).
 */
static void
fail_with_error_reply(RedisFailure *failure, const RespValue *reply)
{
	const char *text = reply->str;
	int			length = reply->length;
	int			word = 0;

	while (word < length && text[word] != ' ')
		word++;
	if ((word == 6 && strncmp(text, "NOPERM", 6) == 0) ||
		contains(text, length, "can't run this command") ||
		contains(text, length, "can't access"))
	{
		int			command = 0;

		/* Our scripts answer "NOPERM <COMMAND> ..." for a command their ACL refused. */
		while (word == 6 && 7 + command < length && command < 31 &&
			   text[7 + command] >= 'A' && text[7 + command] <= 'Z')
			command++;
		failure->kind = REDIS_FAILURE_PERMISSION;
		if (command > 0 && (7 + command == length || text[7 + command] == ' '))
		{
			memcpy(failure->detail, text + 7, command);
			failure->detail[command] = '\0';
		}
		else
			permission_detail(text, length, failure->detail, sizeof(failure->detail));
		return;
	}
	failure->kind = REDIS_FAILURE_REPLY;
	word = Min(word, (int) sizeof(failure->detail) - 1);
	memcpy(failure->detail, text, word);
	failure->detail[word] = '\0';
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
		fail_with_error_reply(&result->failure, reply);
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
	if (!redis_exchange(commands, deadline, handshake_reply, &result, failure))
	{
		failure->maybe_ran = false;
		return false;
	}
	redis_reset_buffers();
	if (result.refused)
	{
		*failure = result.failure;
		redis_disconnect();
		return false;
	}
	return true;
}

/* Opens a non-blocking socket to the URL's server; connect() may still be under way. */
static bool
redis_open_socket(const RedisUrl *url, bool *connecting, RedisFailure *failure)
{
	struct sockaddr_storage address = {0};
	socklen_t	address_length;
	int			family;
	pgsocket	sock;

	if (url->is_unix)
	{
		struct sockaddr_un *unix_address = (struct sockaddr_un *) &address;

		if (strlen(url->path) >= sizeof(unix_address->sun_path))
			return fail(failure, REDIS_FAILURE_CONFIG, "unix socket path too long");
		family = unix_address->sun_family = AF_UNIX;
		strlcpy(unix_address->sun_path, url->path, sizeof(unix_address->sun_path));
		address_length = sizeof(struct sockaddr_un);
	}
	else
	{
		const char *host = redis_address(url->host);
		struct sockaddr_in *v4 = (struct sockaddr_in *) &address;
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *) &address;

		if (host == NULL)
		{
			failure->backend_only = true;
			return fail(failure, REDIS_FAILURE_CONNECT, "host name does not resolve");
		}
		if (inet_pton(AF_INET, host, &v4->sin_addr) == 1)
		{
			family = v4->sin_family = AF_INET;
			v4->sin_port = htons(url->port);
			address_length = sizeof(*v4);
		}
		else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1)
		{
			family = v6->sin6_family = AF_INET6;
			v6->sin6_port = htons(url->port);
			address_length = sizeof(*v6);
		}
		else
			return fail(failure, REDIS_FAILURE_CONFIG, "host is not an address");
	}

	if (!AcquireExternalFD())
	{
		failure->backend_only = true;
		return fail(failure, REDIS_FAILURE_CONNECT, "too many open files");
	}
	sock = socket(family, SOCK_STREAM, 0);
	if (sock == PGINVALID_SOCKET || !pg_set_noblock(sock))
	{
		int			error = errno;

		if (sock != PGINVALID_SOCKET)
			closesocket(sock);
		ReleaseExternalFD();
		failure->backend_only = true;
		return fail(failure, REDIS_FAILURE_CONNECT, strerror(error));
	}
	if (!url->is_unix)
	{
		int			on = 1;

		(void) setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
	}
	connection.sock = sock;
	if (connect(sock, (struct sockaddr *) &address, address_length) == 0)
		*connecting = false;
	else if (errno == EINPROGRESS || errno == EINTR)
		*connecting = true;
	else
	{
		fail(failure, REDIS_FAILURE_CONNECT, strerror(errno));
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
	RedisUrl	url;
	const char *problem;
	const char *password;
	int64		connect_deadline;
	bool		connecting;

	if (rl_redis_url == NULL || rl_redis_url[0] == '\0')
		return fail(failure, REDIS_FAILURE_CONFIG, secret_url_problem() ? secret_url_problem() :
					"ratelimit.redis_url is not set");
	if (!redis_url_parse(rl_redis_url, &url, &problem))
		return fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is invalid");
	if (!secret_redis_password(&url, &password, &problem))
		return fail(failure, REDIS_FAILURE_CONFIG, problem);

	redis_reset_buffers();
	if (!redis_open_socket(&url, &connecting, failure))
		return false;
	connection.busy = true;
#if PG_VERSION_NUM >= 170000
	connection.wait_set = CreateWaitEventSet(NULL, 3);
#else
	connection.wait_set = CreateWaitEventSet(TopMemoryContext, 3);
#endif
	AddWaitEventToSet(connection.wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	if (IsUnderPostmaster)
		AddWaitEventToSet(connection.wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET,
						  NULL, NULL);
	connection.socket_event = AddWaitEventToSet(connection.wait_set, WL_SOCKET_WRITEABLE,
												connection.sock, NULL, NULL);

	connect_deadline = rl_monotonic_us() + (int64) rl_connect_timeout_ms * 1000;
	if (deadline != 0)
		connect_deadline = Min(connect_deadline, deadline);
	/* A non-blocking connect is done when the socket is writable; SO_ERROR says how. */
	if (connecting)
	{
		int			socket_error = 0;
		socklen_t	length = sizeof(socket_error);

		if (redis_wait(WL_SOCKET_WRITEABLE, connect_deadline) == 0)
			return fail_and_disconnect(failure, REDIS_FAILURE_TIMEOUT, "connect timeout");
		if (getsockopt(connection.sock, SOL_SOCKET, SO_ERROR, &socket_error, &length) != 0)
			socket_error = errno;
		if (socket_error != 0)
			return fail_and_disconnect(failure, REDIS_FAILURE_CONNECT, strerror(socket_error));
	}
	if (!redis_handshake(&url, password, connect_deadline, failure))
		return false;

	connection.url = MemoryContextStrdup(TopMemoryContext, rl_redis_url);
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
	char		byte;
	ssize_t		peeked;

	if (connection.sock == PGINVALID_SOCKET)
		return false;
	if (!connection.busy && strcmp(connection.url, rl_redis_url ? rl_redis_url : "") == 0)
	{
		do
			peeked = recv(connection.sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
		while (peeked < 0 && errno == EINTR);
		if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return true;
	}
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
		connection.sock != PGINVALID_SOCKET && connection.busy)
		redis_disconnect();
}

/* Registers the transaction callback; called once per process from _PG_init. */
void
redis_init(void)
{
	RegisterXactCallback(redis_xact_callback, NULL);
}

/* Computes the script's SHA1 in hex, once. */
static void
redis_script_prepare(RedisScript *script)
{
	pg_cryptohash_ctx *context;
	uint8		digest[SHA1_DIGEST_LENGTH];

	if (script->sha1[0] != '\0')
		return;
	context = pg_cryptohash_create(PG_SHA1);
	if (context == NULL ||
		pg_cryptohash_init(context) < 0 ||
		pg_cryptohash_update(context, (const uint8 *) script->body, strlen(script->body)) < 0 ||
		pg_cryptohash_final(context, digest, sizeof(digest)) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not compute the SHA1 of script %s", script->name)));
	pg_cryptohash_free(context);
	script->sha1[hex_encode((const char *) digest, SHA1_DIGEST_LENGTH, script->sha1)] = '\0';
}

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
	resp_append_command(&connection.output, argc, argv);
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
		if (reply->length >= 8 && strncmp(reply->str, "NOSCRIPT", 8) == 0)
		{
			call->failure.kind = REDIS_FAILURE_REPLY;
			strlcpy(call->failure.detail, "NOSCRIPT", sizeof(call->failure.detail));
			pipeline->resend++;
			return;
		}
		fail_with_error_reply(&call->failure, reply);
		return;
	}
	if (reply->type != RESP_ARRAY || reply->length != call->nresults)
	{
		fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		return;
	}
	resp_iterate(reply, &elements);
	while (resp_next(&elements, &element))
	{
		if (element.type != RESP_INTEGER)
		{
			fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
			return;
		}
		call->results[n++] = element.integer;
	}
	call->answered = true;
	call->failure.maybe_ran = false;
}

/* Sends the calls still to be sent (all, or those that answered NOSCRIPT) and reads their replies. */
static bool
redis_send_calls(Pipeline *pipeline, int ncalls, bool by_sha, int64 deadline,
				 RedisFailure *failure)
{
	int			count = 0;

	for (int i = 0; i < ncalls; i++)
	{
		RedisCall  *call = &pipeline->calls[i];

		if (!by_sha && !(call->failure.kind == REDIS_FAILURE_REPLY &&
						 strcmp(call->failure.detail, "NOSCRIPT") == 0))
			continue;
		/* Sent again: until it answers, it is a request that went out. */
		memset(&call->failure, 0, sizeof(call->failure));
		call->failure.maybe_ran = true;
		redis_append_call(call, by_sha);
		pipeline->sent[count++] = i;
	}
	pipeline->resend = 0;
	if (count == 0)
		return true;
	if (!redis_exchange(count, deadline, call_reply, pipeline, failure))
		return false;
	redis_reset_buffers();
	return true;
}

/*
 * Runs calls in one pipeline (one write, one round trip) and stores each one's
 * answer in it. deadline (rl_monotonic_us time) bounds it all, connect
 * included; 0 means the usual deadlines (connect_timeout to connect, then
 * command_timeout from the first byte sent). Returns false, saying why in
 * failure, when the connection failed: the calls answered before that keep
 * their answers, and failure->maybe_ran says whether the others may have run.
 * A call Redis answered with an error has it in its own failure. Never raises
 * an error itself, except for an interrupt served while waiting.
 */
bool
redis_run_scripts(RedisCall *calls, int ncalls, int64 deadline, RedisFailure *failure)
{
	Pipeline	pipeline = {.calls = calls};
	bool		reopened = false;
	int64		sent;
	int64		request_deadline;
	bool		ok;

	Assert(ncalls > 0);
	memset(failure, 0, sizeof(*failure));
	redis_last_round_trip_us = -1;
	for (int i = 0; i < ncalls; i++)
	{
		Assert(calls[i].nresults > 0 && calls[i].nkeys > 0);
		redis_script_prepare(calls[i].script);
		calls[i].answered = false;
		memset(&calls[i].failure, 0, sizeof(calls[i].failure));
	}
	pipeline.sent = palloc(ncalls * sizeof(int));

	for (;;)
	{
		if (!redis_connection_usable())
		{
			if (!redis_connect(deadline, failure))
			{
				redis_forget_address();
				pfree(pipeline.sent);
				return false;
			}
			reopened = true;
		}
		sent = rl_monotonic_us();
		request_deadline = deadline != 0 ? deadline : sent + (int64) rl_command_timeout_ms * 1000;
		connection.busy = true;
		ok = redis_send_calls(&pipeline, ncalls, true, request_deadline, failure);
		/* A connection that broke before any of the request went out is opened again, once. */
		if (ok || reopened || failure->maybe_ran || failure->kind != REDIS_FAILURE_IO)
			break;
		memset(failure, 0, sizeof(*failure));
		reopened = true;
	}
	if (ok && pipeline.resend > 0)
		ok = redis_send_calls(&pipeline, ncalls, false, request_deadline, failure);
	if (ok)
	{
		connection.busy = false;
		redis_last_round_trip_us = rl_monotonic_us() - sent;
	}
	pfree(pipeline.sent);
	return ok;
}

/*
 * Runs one script call and stores its reply, an array of nresults integers,
 * in results. On any failure (the connection's, or an error reply) returns
 * false and says why in failure; the caller's fail mode decides what that
 * means.
 */
bool
redis_run_script(RedisScript *script, int nkeys, const char *const *keys,
				 int nargs, const char *const *args, long long *results, int nresults,
				 RedisFailure *failure)
{
	RedisCall	call = {
		.script = script,
		.nkeys = nkeys,
		.keys = keys,
		.nargs = nargs,
		.args = args,
		.nresults = nresults,
		.results = results,
	};

	if (!redis_run_scripts(&call, 1, 0, failure))
		return false;
	*failure = call.failure;
	return call.answered;
}

/* The failure kind as logs and docs name it. */
const char *
redis_failure_kind_name(RedisFailureKind kind)
{
	switch (kind)
	{
		case REDIS_FAILURE_NONE:
			return "none";
		case REDIS_FAILURE_CONFIG:
			return "configuration";
		case REDIS_FAILURE_CONNECT:
			return "connect";
		case REDIS_FAILURE_TIMEOUT:
			return "timeout";
		case REDIS_FAILURE_IO:
			return "connection lost";
		case REDIS_FAILURE_PROTOCOL:
			return "protocol";
		case REDIS_FAILURE_REPLY:
			return "error reply";
		case REDIS_FAILURE_PERMISSION:
			return "permission";
	}
	return "unknown";
}
