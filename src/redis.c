/*
 * redis.c
 *	  One Redis connection per backend, opened lazily, used without ever blocking.
 *
 * hiredis 0.14 only formats commands and parses replies here: the socket is
 * non-blocking, and every wait goes through a WaitEventSet that also wakes on
 * the latch (so cancel and statement_timeout work while Redis is silent) and
 * exits on postmaster death. Each call has one deadline. A connection whose
 * request was cut off (deadline, error, interrupt) is closed, never reused: it
 * might still deliver the old answer.
 *
 * The interface is "run this script for this key", so that routing keys to
 * several nodes (Redis Cluster) can come later behind it.
 */
#include "ratelimit.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <hiredis/hiredis.h>

#include "common/cryptohash.h"
#include "common/sha1.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 170000
#include "utils/wait_event.h"
#endif

#include "redis.h"
#include "redis_url.h"

typedef struct RedisConnection
{
	redisContext *context;		/* NULL: not connected */
	WaitEventSet *wait_set;
	int			socket_event;	/* position of the socket in wait_set */
	char	   *url;			/* the ratelimit.redis_url it was opened with */
	bool		busy;			/* a request is under way (or was cut off) */
} RedisConnection;

static RedisConnection connection;

int64		redis_last_round_trip_us = -1;

/* The address a host name resolved to, kept until a connect to it fails. */
static char resolved_host[256];
static char resolved_address[INET6_ADDRSTRLEN];

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
	/* IPv4 first, as hiredis does: "localhost" must not land on a ::1 nobody listens on. */
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

/* Closes the connection and frees everything it holds. */
static void
redis_disconnect(void)
{
	if (connection.wait_set != NULL)
		FreeWaitEventSet(connection.wait_set);
	if (connection.context != NULL)
	{
		redisFree(connection.context);
		ReleaseExternalFD();
	}
	if (connection.url != NULL)
		pfree(connection.url);
	memset(&connection, 0, sizeof(connection));
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
 * Waits until the socket is ready for events (WL_SOCKET_READABLE or
 * WL_SOCKET_WRITEABLE) or the deadline passes; false on timeout. Interrupts
 * are served while waiting, so a cancel raises its error from here.
 */
static bool
redis_wait(uint32 events, int64 deadline)
{
	ModifyWaitEvent(connection.wait_set, connection.socket_event, events, NULL);
	for (;;)
	{
		WaitEvent	event;
		int64		now = rl_monotonic_us();
		long		remaining_ms;

		if (now >= deadline)
			return false;
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
			return true;
	}
}

/*
 * Sends what hiredis has buffered, then reads one reply; NULL reply on failure.
 * deadline is in rl_monotonic_us() time.
 */
static bool
redis_request(int64 deadline, redisReply **reply, RedisFailure *failure)
{
	redisContext *context = connection.context;
	int			done = 0;
	void	   *answer = NULL;

	Assert(context != NULL && connection.busy);
	*reply = NULL;
	for (;;)
	{
		if (redisBufferWrite(context, &done) != REDIS_OK)
			return fail_and_disconnect(failure, REDIS_FAILURE_IO, "write failed");
		if (done)
			break;
		if (!redis_wait(WL_SOCKET_WRITEABLE, deadline))
			return fail_and_disconnect(failure, REDIS_FAILURE_TIMEOUT, "timeout");
	}
	for (;;)
	{
		if (redisGetReplyFromReader(context, &answer) != REDIS_OK)
			return fail_and_disconnect(failure, REDIS_FAILURE_PROTOCOL, "unparsable reply");
		if (answer != NULL)
			break;
		if (!redis_wait(WL_SOCKET_READABLE, deadline))
			return fail_and_disconnect(failure, REDIS_FAILURE_TIMEOUT, "timeout");
		if (redisBufferRead(context) != REDIS_OK)
			return fail_and_disconnect(failure, REDIS_FAILURE_IO,
									   context->err == REDIS_ERR_EOF ?
									   "connection closed" : "read failed");
	}
	*reply = answer;
	return true;
}

/* Copies the first word of an error reply ("NOSCRIPT", "OOM", ...) into failure. */
static bool
fail_with_error_reply(RedisFailure *failure, redisReply *reply)
{
	char		word[sizeof(failure->detail)];
	size_t		length = strcspn(reply->str, " \r\n");

	if (length >= sizeof(word))
		length = sizeof(word) - 1;
	memcpy(word, reply->str, length);
	word[length] = '\0';
	return fail(failure, REDIS_FAILURE_REPLY, word);
}

/* Sends one command of the handshake and expects a status or OK reply. */
static bool
redis_handshake_command(int argc, const char **argv, int64 deadline,
						RedisFailure *failure)
{
	redisReply *reply;
	bool		ok;

	if (redisAppendCommandArgv(connection.context, argc, argv, NULL) != REDIS_OK)
		return fail_and_disconnect(failure, REDIS_FAILURE_IO, "could not format command");
	if (!redis_request(deadline, &reply, failure))
		return false;
	ok = reply->type != REDIS_REPLY_ERROR;
	if (!ok)
	{
		fail_with_error_reply(failure, reply);
		failure->kind = REDIS_FAILURE_CONNECT;
	}
	freeReplyObject(reply);
	if (!ok)
		redis_disconnect();
	return ok;
}

/* Opens the connection named by ratelimit.redis_url, with AUTH and SELECT. */
static bool
redis_connect(RedisFailure *failure)
{
	RedisUrl	url;
	const char *problem;
	int64		deadline;
	redisContext *context;
	int			socket_error = 0;
	socklen_t	length = sizeof(socket_error);
	const char *address = NULL;

	if (rl_redis_url == NULL || rl_redis_url[0] == '\0')
		return fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is not set");
	if (!redis_url_parse(rl_redis_url, &url, &problem))
		return fail(failure, REDIS_FAILURE_CONFIG, "ratelimit.redis_url is invalid");

	if (!url.is_unix)
	{
		address = redis_address(url.host);
		if (address == NULL)
		{
			failure->backend_only = true;
			return fail(failure, REDIS_FAILURE_CONNECT, "host name does not resolve");
		}
	}
	if (!AcquireExternalFD())
	{
		failure->backend_only = true;
		return fail(failure, REDIS_FAILURE_CONNECT, "too many open files");
	}
	context = url.is_unix ? redisConnectUnixNonBlock(url.path) :
		redisConnectNonBlock(address, url.port);
	if (context == NULL || context->err)
	{
		fail(failure, REDIS_FAILURE_CONNECT, context ? context->errstr : "out of memory");
		if (context != NULL)
			redisFree(context);
		ReleaseExternalFD();
		return false;
	}

	connection.context = context;
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
												context->fd, NULL, NULL);

	/* A non-blocking connect is done when the socket is writable; SO_ERROR says how. */
	deadline = rl_monotonic_us() + (int64) rl_connect_timeout_ms * 1000;
	if (!redis_wait(WL_SOCKET_WRITEABLE, deadline))
		return fail_and_disconnect(failure, REDIS_FAILURE_TIMEOUT, "connect timeout");
	if (getsockopt(context->fd, SOL_SOCKET, SO_ERROR, &socket_error, &length) != 0)
		socket_error = errno;
	if (socket_error != 0)
		return fail_and_disconnect(failure, REDIS_FAILURE_CONNECT, strerror(socket_error));

	if (url.password != NULL)
	{
		const char *argv[3] = {"AUTH"};
		int			argc = 1;

		if (url.user != NULL)
			argv[argc++] = url.user;
		argv[argc++] = url.password;
		if (!redis_handshake_command(argc, argv, deadline, failure))
			return false;
	}
	if (url.database != 0)
	{
		char		database[16];
		const char *argv[2] = {"SELECT", database};

		snprintf(database, sizeof(database), "%d", url.database);
		if (!redis_handshake_command(2, argv, deadline, failure))
			return false;
	}

	connection.url = MemoryContextStrdup(TopMemoryContext, rl_redis_url);
	connection.busy = false;
	return true;
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

/* Queues EVALSHA (or EVAL with the body) of script for keys and args. */
static bool
redis_append_script(RedisScript *script, bool by_sha, int nkeys, const char *const *keys,
					int nargs, const char *const *args, RedisFailure *failure)
{
	int			argc = 3 + nkeys + nargs;
	const char **argv = palloc(argc * sizeof(char *));
	char		key_count[12];
	int			rc;

	snprintf(key_count, sizeof(key_count), "%d", nkeys);
	argv[0] = by_sha ? "EVALSHA" : "EVAL";
	argv[1] = by_sha ? script->sha1 : script->body;
	argv[2] = key_count;
	for (int i = 0; i < nkeys; i++)
		argv[3 + i] = keys[i];
	for (int i = 0; i < nargs; i++)
		argv[3 + nkeys + i] = args[i];
	/* Explicit argv, never a format string: keys and arguments are binary-safe. */
	rc = redisAppendCommandArgv(connection.context, argc, argv, NULL);
	pfree(argv);
	if (rc != REDIS_OK)
		return fail_and_disconnect(failure, REDIS_FAILURE_IO, "could not format command");
	return true;
}

/*
 * Runs script for keys and args (NUL-terminated strings; every key in one hash
 * tag, so that one node holds them all) and stores its reply, an array of
 * nresults integers, in results. On any failure returns false and says why in
 * failure; the caller's fail mode decides what that means. Never raises an
 * error itself, except for an interrupt served while waiting.
 */
bool
redis_run_script(RedisScript *script, int nkeys, const char *const *keys,
				 int nargs, const char *const *args, long long *results, int nresults,
				 RedisFailure *failure)
{
	int64		sent;
	int64		deadline;
	redisReply *reply;

	Assert(nresults > 0 && nkeys > 0);
	memset(failure, 0, sizeof(*failure));
	redis_last_round_trip_us = -1;
	redis_script_prepare(script);

	/* A cut-off request, or a changed URL, means this connection is not to be used. */
	if (connection.context != NULL &&
		(connection.busy || strcmp(connection.url, rl_redis_url ? rl_redis_url : "") != 0))
		redis_disconnect();
	if (connection.context == NULL && !redis_connect(failure))
	{
		redis_forget_address();
		return false;
	}

	sent = rl_monotonic_us();
	deadline = sent + (int64) rl_command_timeout_ms * 1000;
	connection.busy = true;
	if (!redis_append_script(script, true, nkeys, keys, nargs, args, failure) ||
		!redis_request(deadline, &reply, failure))
		return false;

	/* Redis restarted, failed over or flushed its scripts: send the body once. */
	if (reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOSCRIPT", 8) == 0)
	{
		freeReplyObject(reply);
		if (!redis_append_script(script, false, nkeys, keys, nargs, args, failure) ||
			!redis_request(deadline, &reply, failure))
			return false;
	}
	connection.busy = false;
	redis_last_round_trip_us = rl_monotonic_us() - sent;

	if (reply->type == REDIS_REPLY_ERROR)
		fail_with_error_reply(failure, reply);
	else if (reply->type != REDIS_REPLY_ARRAY || reply->elements != (size_t) nresults)
		fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	else
	{
		for (int i = 0; i < nresults; i++)
		{
			if (reply->element[i]->type != REDIS_REPLY_INTEGER)
			{
				fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
				break;
			}
			results[i] = reply->element[i]->integer;
		}
	}
	freeReplyObject(reply);
	return failure->kind == REDIS_FAILURE_NONE;
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
	}
	return "unknown";
}
