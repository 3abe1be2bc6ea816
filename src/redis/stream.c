/*
 * stream.c
 *	  What a connection reads and writes: a socket, or TLS over it. The rest
 *	  of the transport speaks to this, and never asks which.
 */
#include "prelude.h"

#include "storage/latch.h"

#include "redis/stream.h"

/*
 * Connects stream to endpoint, with TLS when tls, within timeout_ms and
 * deadline (see socket_open; the handshake counts against the same bound).
 * False, saying why, with nothing left open, when it cannot.
 */
bool
stream_open(RedisStream *stream, const RedisEndpoint *endpoint, bool tls, int timeout_ms,
			int64 deadline, int64 *connect_deadline, RedisFailure *failure)
{
	if (!socket_open(&stream->socket, endpoint, timeout_ms, deadline, connect_deadline, failure))
		return false;
	stream->use_tls = tls;
	if (tls && !tls_open(&stream->tls, &stream->socket, endpoint->host, *connect_deadline, failure))
	{
		stream_close(stream);
		socket_forget_address();
		return false;
	}
	return true;
}

bool
stream_is_open(const RedisStream *stream)
{
	return socket_is_open(&stream->socket);
}

/* True when the idle stream is open still: nothing arrived, Redis did not close it. */
bool
stream_idle_and_open(RedisStream *stream)
{
	return stream->use_tls ? tls_idle_and_open(&stream->tls, &stream->socket) :
		socket_idle_and_open(&stream->socket);
}

/*
 * Waits until the stream may go on with one of events or deadline passes; 0
 * on timeout. With TLS, bytes OpenSSL holds already make it readable at once,
 * and it also waits for what OpenSSL needs; whatever occurs, each event asked
 * for is worth trying again (a read or write that cannot go on says EAGAIN).
 */
uint32
stream_wait(RedisStream *stream, uint32 events, int64 deadline)
{
	uint32		wanted;

	if (!stream->use_tls)
		return socket_wait(&stream->socket, events, deadline);
	wanted = tls_wants(&stream->tls);
	/*
	 * Bytes OpenSSL holds make the stream readable at once, unless the last
	 * read said they are not a whole record (it wants the socket): else a
	 * record cut short would be tried again and again, never waiting, past
	 * the deadline and any cancel.
	 */
	if ((events & WL_SOCKET_READABLE) && wanted == 0 && tls_pending(&stream->tls))
		return WL_SOCKET_READABLE;
	/* What OpenSSL waits for is all that lets it go on (a write that wants to read). */
	return socket_wait(&stream->socket, wanted != 0 ? wanted : events, deadline) != 0 ?
		events : 0;
}

ssize_t
stream_send(RedisStream *stream, const char *data, size_t length)
{
	return stream->use_tls ? tls_send(&stream->tls, data, length) :
		socket_send(&stream->socket, data, length);
}

ssize_t
stream_receive(RedisStream *stream, char *buffer, size_t length)
{
	return stream->use_tls ? tls_receive(&stream->tls, buffer, length) :
		socket_receive(&stream->socket, buffer, length);
}

/* Closes the stream, if open. */
void
stream_close(RedisStream *stream)
{
	if (stream->use_tls)
		tls_close(&stream->tls);
	stream->use_tls = false;
	socket_close(&stream->socket);
}
