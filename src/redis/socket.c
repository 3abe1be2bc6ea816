/*
 * socket.c
 *	  A socket to Redis: opened without blocking, waited on with the latch,
 *	  read and written as far as it takes.
 *
 * Every wait goes through a WaitEventSet that also wakes on the latch (so a
 * cancel or statement_timeout is served while Redis is silent) and exits on
 * postmaster death; each has a deadline. What goes over the socket is
 * connection.c's business: this file is what another transport (TLS) would
 * replace.
 */
#include "prelude.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#if PG_VERSION_NUM >= 170000
#include "utils/wait_event.h"
#endif

#include "base/clock.h"
#include "redis/socket.h"

/*
 * The addresses host names resolved to, kept until a connect to one fails.
 * A few: a Sentinel URL names several hosts.
 */
#define RESOLVED_MAX 8
typedef struct Resolved
{
	char		host[256];
	char		address[INET6_ADDRSTRLEN];
} Resolved;
static Resolved resolved[RESOLVED_MAX];
static int	resolved_next = 0;	/* the entry to replace next */
static int	resolved_last = -1; /* the entry of the last connect, to forget if it fails */

/*
 * The address to connect to for host: host itself when it is an IP literal,
 * else the cached result of resolving it. Resolving blocks (getaddrinfo cannot
 * be interrupted), so it happens once per backend and host, and again only
 * after a connect failed, which the breaker allows at most once per
 * retry_interval. NULL when the name does not resolve.
 */
static const char *
resolve_address(const char *host)
{
	unsigned char buffer[sizeof(struct in6_addr)];
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	struct addrinfo *addresses;
	Resolved   *entry;
	bool		ok;

	resolved_last = -1;
	if (inet_pton(AF_INET, host, buffer) == 1 || inet_pton(AF_INET6, host, buffer) == 1)
		return host;
	for (int i = 0; i < RESOLVED_MAX; i++)
		if (resolved[i].address[0] != '\0' && strcmp(resolved[i].host, host) == 0)
		{
			resolved_last = i;
			return resolved[i].address;
		}
	if (strlen(host) >= sizeof(entry->host))
		return NULL;
	entry = &resolved[resolved_next];
	/* IPv4 first: "localhost" must not land on a ::1 nobody listens on. */
	if (getaddrinfo(host, NULL, &hints, &addresses) != 0)
	{
		hints.ai_family = AF_INET6;
		if (getaddrinfo(host, NULL, &hints, &addresses) != 0)
			return NULL;
	}
	ok = getnameinfo(addresses->ai_addr, addresses->ai_addrlen, entry->address,
					 sizeof(entry->address), NULL, 0, NI_NUMERICHOST) == 0;
	freeaddrinfo(addresses);
	if (!ok)
	{
		entry->address[0] = '\0';
		return NULL;
	}
	strlcpy(entry->host, host, sizeof(entry->host));
	resolved_last = resolved_next;
	resolved_next = (resolved_next + 1) % RESOLVED_MAX;
	return entry->address;
}

/*
 * Forgets the address of the last connect, so that the next connect to its
 * host resolves the name again (after a failover the name may point elsewhere).
 */
void
socket_forget_address(void)
{
	if (resolved_last >= 0)
		resolved[resolved_last].address[0] = '\0';
	resolved_last = -1;
}

/*
 * CHECK_FOR_INTERRUPTS, but a cancel or statement timeout raised here is logged
 * without the statement, which may hold a subject.
 */
void
socket_check_interrupts(void)
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
uint32
socket_wait_event(void)
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
 * True when a wait must end at once although no interrupt can be served:
 * where interrupts are held (giving back at the end of a transaction), a
 * terminate or a cancel (statement_timeout too) stops the wait, so that the
 * backend is not held up by a Redis that is silent; the terminate is served
 * as soon as interrupts are resumed. (At exit it is being served: what is
 * given back then has its deadline.)
 */
bool
socket_wait_abandoned(void)
{
	return (ProcDiePending || QueryCancelPending) && InterruptHoldoffCount > 0 &&
		!proc_exit_inprogress;
}

/*
 * Waits until the socket is ready for one of events (WL_SOCKET_READABLE,
 * WL_SOCKET_WRITEABLE) or the deadline (clock_monotonic_us time) passes. Returns
 * the events that occurred, 0 on timeout. Interrupts are served while waiting,
 * so a cancel raises its error from here.
 */
uint32
socket_wait(RedisSocket *rs, uint32 events, int64 deadline)
{
	ModifyWaitEvent(rs->wait_set, rs->event, events, NULL);
	for (;;)
	{
		WaitEvent	event;
		int64		now = clock_monotonic_us();
		long		remaining_ms;

		if (now >= deadline || socket_wait_abandoned())
			return 0;
		remaining_ms = (long) ((deadline - now + 999) / 1000);
		if (WaitEventSetWait(rs->wait_set, remaining_ms, &event, 1,
							 socket_wait_event()) == 0)
			continue;			/* timed out: the check above decides */
		if (event.events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			socket_check_interrupts();
			continue;
		}
		if (event.events & events)
			return event.events & events;
	}
}

/* Opens a non-blocking socket to endpoint; connect() may still be under way. */
static bool
open_socket(RedisSocket *rs, const RedisEndpoint *endpoint, bool *connecting,
			RedisFailure *failure)
{
	struct sockaddr_storage address = {0};
	socklen_t	address_length;
	int			family;
	pgsocket	sock;

	if (endpoint->path != NULL)
	{
		struct sockaddr_un *unix_address = (struct sockaddr_un *) &address;

		if (strlen(endpoint->path) >= sizeof(unix_address->sun_path))
			return redis_fail(failure, REDIS_FAILURE_CONFIG, "unix socket path too long");
		family = unix_address->sun_family = AF_UNIX;
		strlcpy(unix_address->sun_path, endpoint->path, sizeof(unix_address->sun_path));
		address_length = sizeof(struct sockaddr_un);
	}
	else
	{
		const char *host = resolve_address(endpoint->host);
		struct sockaddr_in *v4 = (struct sockaddr_in *) &address;
		struct sockaddr_in6 *v6 = (struct sockaddr_in6 *) &address;

		if (host == NULL)
		{
			failure->backend_only = true;
			return redis_fail(failure, REDIS_FAILURE_CONNECT, "host name does not resolve");
		}
		if (inet_pton(AF_INET, host, &v4->sin_addr) == 1)
		{
			family = v4->sin_family = AF_INET;
			v4->sin_port = htons(endpoint->port);
			address_length = sizeof(*v4);
		}
		else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1)
		{
			family = v6->sin6_family = AF_INET6;
			v6->sin6_port = htons(endpoint->port);
			address_length = sizeof(*v6);
		}
		else
			return redis_fail(failure, REDIS_FAILURE_CONFIG, "host is not an address");
	}

	if (!AcquireExternalFD())
	{
		failure->backend_only = true;
		return redis_fail(failure, REDIS_FAILURE_CONNECT, "too many open files");
	}
	sock = socket(family, SOCK_STREAM, 0);
	if (sock == PGINVALID_SOCKET || !pg_set_noblock(sock))
	{
		int			error = errno;

		if (sock != PGINVALID_SOCKET)
			closesocket(sock);
		ReleaseExternalFD();
		failure->backend_only = true;
		return redis_fail(failure, REDIS_FAILURE_CONNECT, strerror(error));
	}
	if (endpoint->path == NULL)
	{
		int			on = 1;

		(void) setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
	}
	rs->sock = sock;
	if (connect(sock, (struct sockaddr *) &address, address_length) == 0)
		*connecting = false;
	else if (errno == EINPROGRESS || errno == EINTR)
		*connecting = true;
	else
	{
		redis_fail(failure, REDIS_FAILURE_CONNECT, strerror(errno));
		socket_close(rs);
		return false;
	}
	return true;
}

/* Like redis_fail(), and closes the socket and forgets the address (a failover may move it). */
static bool
fail_and_close(RedisSocket *rs, RedisFailure *failure, RedisFailureKind kind,
			   const char *detail)
{
	redis_fail(failure, kind, detail);
	socket_close(rs);
	socket_forget_address();
	return false;
}

/*
 * Connects to endpoint within timeout_ms, and deadline
 * (clock_monotonic_us time) when not 0; *connected says when it was done, for
 * what comes after (AUTH, SELECT) to share the same bound. The timeout starts
 * once the name is resolved: resolving blocks and cannot be cut short, and a
 * slow resolver must not read as a Redis that cannot be reached. False,
 * saying why, with nothing left open and the address forgotten, when it
 * cannot.
 */
bool
socket_open(RedisSocket *rs, const RedisEndpoint *endpoint, int timeout_ms, int64 deadline,
			int64 *connect_deadline, RedisFailure *failure)
{
	bool		connecting = false;

	Assert(rs->sock == PGINVALID_SOCKET);
	if (!open_socket(rs, endpoint, &connecting, failure))
	{
		socket_forget_address();
		return false;
	}
	*connect_deadline = clock_monotonic_us() + (int64) timeout_ms * 1000;
	if (deadline != 0)
		*connect_deadline = Min(*connect_deadline, deadline);
	deadline = *connect_deadline;
#if PG_VERSION_NUM >= 170000
	rs->wait_set = CreateWaitEventSet(NULL, 3);
#else
	rs->wait_set = CreateWaitEventSet(TopMemoryContext, 3);
#endif
	AddWaitEventToSet(rs->wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	if (IsUnderPostmaster)
		AddWaitEventToSet(rs->wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	rs->event = AddWaitEventToSet(rs->wait_set, WL_SOCKET_WRITEABLE, rs->sock,
									  NULL, NULL);

	/* A non-blocking connect is done when the socket is writable; SO_ERROR says how. */
	if (connecting)
	{
		int			socket_error = 0;
		socklen_t	length = sizeof(socket_error);

		if (socket_wait(rs, WL_SOCKET_WRITEABLE, deadline) == 0)
			return fail_and_close(rs, failure, REDIS_FAILURE_TIMEOUT, "connect timeout");
		if (getsockopt(rs->sock, SOL_SOCKET, SO_ERROR, &socket_error, &length) != 0)
			socket_error = errno;
		if (socket_error != 0)
			return fail_and_close(rs, failure, REDIS_FAILURE_CONNECT, strerror(socket_error));
	}
	return true;
}

bool
socket_is_open(const RedisSocket *rs)
{
	return rs->sock != PGINVALID_SOCKET;
}

/*
 * True when the open socket is idle and Redis has not closed it meanwhile:
 * there is nothing to read (end of file or stray bytes mean it is gone).
 */
bool
socket_idle_and_open(RedisSocket *rs)
{
	char		byte;
	ssize_t		peeked;

	do
		peeked = recv(rs->sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
	while (peeked < 0 && errno == EINTR);
	return peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* send(), never raising SIGPIPE: the bytes sent, or -1 with errno (EAGAIN: try later). */
ssize_t
socket_send(RedisSocket *rs, const char *data, size_t length)
{
	ssize_t		sent;

	do
		sent = send(rs->sock, data, length, MSG_NOSIGNAL);
	while (sent < 0 && errno == EINTR);
	return sent;
}

/* recv(): the bytes read, 0 at the end, or -1 with errno (EAGAIN: nothing yet). */
ssize_t
socket_receive(RedisSocket *rs, char *buffer, size_t length)
{
	ssize_t		received;

	do
		received = recv(rs->sock, buffer, length, 0);
	while (received < 0 && errno == EINTR);
	return received;
}

/* Closes the socket, if open. */
void
socket_close(RedisSocket *rs)
{
	if (rs->wait_set != NULL)
		FreeWaitEventSet(rs->wait_set);
	rs->wait_set = NULL;
	if (rs->sock != PGINVALID_SOCKET)
	{
		closesocket(rs->sock);
		ReleaseExternalFD();
	}
	rs->sock = PGINVALID_SOCKET;
}
