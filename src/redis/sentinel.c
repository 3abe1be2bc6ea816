/*
 * sentinel.c
 *	  Finding the master of a Sentinel URL: the sentinels are asked, one after
 *	  the other, SENTINEL get-master-addr-by-name, until one names it.
 *
 * The connection to the sentinel that answered is kept open, so that asking
 * again (the connection checks every ratelimit.sentinel_check_interval that
 * its node is still the master) costs one round trip. A search shares one
 * deadline, and each sentinel gets an equal part of what is left, so that one
 * that hangs cannot keep the others from being asked. Sentinels authenticate
 * with ratelimit.sentinel_password_file (and the URL's sentinel_user), apart
 * from the data nodes; with rediss-sentinel:// they are spoken to with TLS.
 */
#include "prelude.h"

#include "utils/memutils.h"

#include "base/clock.h"
#include "base/secret.h"
#include "redis/exchange.h"
#include "redis/sentinel.h"
#include "redis/stream.h"
#include "redis/tls.h"

/* The connection to one sentinel, kept between searches. */
typedef struct SentinelLink
{
	RedisStream stream;
	int			index;			/* the sentinel it is to (or to ask first) */
	char	   *url;			/* the ratelimit.redis_url it was opened for */
	uint32		tls_generation;
	bool		busy;			/* a question is under way, or was cut off */
} SentinelLink;

/* One per target (url.h): a region's Redis may be found through its own sentinels. */
static SentinelLink links[REDIS_MAX_TARGETS];
static bool links_ready = false;

#define L (sentinel_link())

/* The link of the target in use, closed the first time. */
static SentinelLink *
sentinel_link(void)
{
	if (!links_ready)
	{
		RedisStream closed = REDIS_STREAM_CLOSED;

		for (int i = 0; i < REDIS_MAX_TARGETS; i++)
			links[i].stream = closed;
		links_ready = true;
	}
	return &links[redis_url_target()];
}

/* What one sentinel answered, for found_master. */
typedef struct SentinelAnswer
{
	int			replies;		/* the index of the SENTINEL reply */
	bool		refused;		/* an error reply (AUTH refused, an ACL) */
	bool		unknown;		/* a null: the sentinel knows no such master */
	RedisFailure failure;
	char		host[256];
	int			port;
} SentinelAnswer;

/* Reads one reply of a sentinel (AUTH's, then the master's address) into the answer. */
static void
found_master(int index, const RespValue *reply, void *arg)
{
	SentinelAnswer *answer = arg;
	RespIterator elements;
	RespValue	host;
	RespValue	port;
	char		digits[8];

	if (reply->type == RESP_ERROR)
	{
		if (!answer->refused)
			redis_fail_with_error(&answer->failure, reply->str, reply->length);
		answer->refused = true;
		return;
	}
	if (index != answer->replies)
		return;					/* AUTH's +OK */
	if (reply->type == RESP_ARRAY && reply->null)
	{
		answer->unknown = true;
		return;
	}
	if (reply->type == RESP_ARRAY)
		resp_iterate(reply, &elements);
	if (reply->type != RESP_ARRAY || reply->length != 2 ||
		!resp_next(&elements, &host) || !resp_next(&elements, &port) ||
		host.type != RESP_BULK || port.type != RESP_BULK || host.null || port.null ||
		host.length < 1 || host.length >= (int) sizeof(answer->host) ||
		memchr(host.str, '\0', host.length) != NULL ||
		port.length < 1 || port.length >= (int) sizeof(digits))
	{
		redis_fail(&answer->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply from a sentinel");
		answer->refused = true;
		return;
	}
	memcpy(answer->host, host.str, host.length);
	answer->host[host.length] = '\0';
	memcpy(digits, port.str, port.length);
	digits[port.length] = '\0';
	answer->port = atoi(digits);
	if (answer->port < 1 || answer->port > 65535 || strspn(digits, "0123456789") != strlen(digits))
	{
		redis_fail(&answer->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply from a sentinel");
		answer->refused = true;
	}
}

/* Closes the connection to the sentinel. */
static void
sentinel_close(void)
{
	stream_close(&L->stream);
	if (L->url != NULL)
		pfree(L->url);
	L->url = NULL;
	L->busy = false;
	exchange_reset();
}

/* True when the kept connection is to a sentinel of the current URL, idle and open. */
static bool
sentinel_usable(void)
{
	if (!stream_is_open(&L->stream))
		return false;
	if (!L->busy && L->url != NULL &&
		strcmp(L->url, redis_url_current()) == 0 &&
		L->tls_generation == tls_settings_generation() &&
		stream_idle_and_open(&L->stream))
		return true;
	sentinel_close();
	return false;
}

/*
 * Asks sentinel i of url for its master, before deadline: on the kept
 * connection when it is to that sentinel, else on a new one (which is kept).
 * True with answer filled when it answered.
 */
static bool
ask_sentinel(const RedisUrl *url, int i, const char *password, int64 deadline,
			 SentinelAnswer *answer, RedisFailure *failure)
{
	const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", url->master_name};
	StringInfo	out;
	bool		asked;

	memset(answer, 0, sizeof(*answer));
	if (!sentinel_usable() || L->index != i)
	{
		RedisEndpoint endpoint = {.host = url->sentinels[i].host,.port = url->sentinels[i].port};
		int64		remaining_ms = (deadline - clock_monotonic_us()) / 1000;
		int64		connect_deadline;

		sentinel_close();
		if (remaining_ms < 1)
			return redis_fail(failure, REDIS_FAILURE_TIMEOUT, "no sentinel answered in time");
		L->busy = true;
		if (!stream_open(&L->stream, &endpoint, url->tls, (int) remaining_ms, deadline,
						 &connect_deadline, failure))
		{
			L->busy = false;
			return false;
		}
		L->index = i;
		L->url = MemoryContextStrdup(TopMemoryContext, redis_url_current());
		L->tls_generation = tls_settings_generation();
		exchange_reset();
		if (password != NULL)
		{
			const char *auth_argv[3] = {"AUTH"};
			int			argc = 1;

			if (url->sentinel_user != NULL)
				auth_argv[argc++] = url->sentinel_user;
			auth_argv[argc++] = password;
			resp_append_command(exchange_output(), argc, auth_argv);
			answer->replies++;
		}
	}
	else
		exchange_reset();
	L->busy = true;
	out = exchange_output();
	resp_append_command(out, 3, argv);
	asked = exchange_run(&L->stream, answer->replies + 1, deadline, 0, found_master, answer,
						 failure);
	if (!asked || answer->refused)
	{
		sentinel_close();
		if (!asked)
			return false;
		*failure = answer->failure;
		if (failure->kind == REDIS_FAILURE_REPLY)
			failure->kind = REDIS_FAILURE_SENTINEL;
		return false;
	}
	L->busy = false;
	return true;
}

/*
 * Finds the master of the Sentinel URL url within timeout_ms (and deadline,
 * when not 0): host (palloc'd) and port. False, with the last sentinel's
 * failure as kind SENTINEL (or PERMISSION), when no sentinel names it.
 */
bool
sentinel_find_master(const RedisUrl *url, int timeout_ms, int64 deadline, RedisHostPort *master,
					 RedisFailure *failure)
{
	int64		search_deadline = clock_monotonic_us() + (int64) timeout_ms * 1000;
	const char *password;
	const char *problem;
	bool		unknown = false;
	int			first;

	Assert(url->nsentinels > 0);
	if (deadline != 0)
		search_deadline = Min(search_deadline, deadline);
	/* ratelimit.sentinel_password_file is for this server's sentinels, not a region's. */
	password = NULL;
	if (redis_url_target() == 0 && !secret_sentinel_password(&password, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, problem);
	first = L->index % url->nsentinels;
	for (int n = 0; n < url->nsentinels; n++)
	{
		int			i = (first + n) % url->nsentinels;
		int64		now = clock_monotonic_us();
		/* An equal part of what is left for each sentinel not yet asked. */
		int64		share = now + (search_deadline - now) / (url->nsentinels - n);
		SentinelAnswer answer;

		memset(failure, 0, sizeof(*failure));
		if (!ask_sentinel(url, i, password, share, &answer, failure))
			continue;
		if (answer.unknown)
		{
			unknown = true;
			continue;
		}
		master->host = pstrdup(answer.host);
		master->port = answer.port;
		return true;
	}
	/* Next time, start with the sentinel after the one asked first now. */
	L->index = (first + 1) % url->nsentinels;
	if (unknown)
		return redis_fail(failure, REDIS_FAILURE_SENTINEL, "no sentinel knows the master");
	if (failure->kind != REDIS_FAILURE_PERMISSION)
	{
		char		detail[sizeof(failure->detail)];

		snprintf(detail, sizeof(detail), "no sentinel answered (%s: %s)",
				 redis_failure_kind_name(failure->kind), failure->detail);
		redis_fail(failure, REDIS_FAILURE_SENTINEL, detail);
	}
	return false;
}
