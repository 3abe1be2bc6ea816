/*
 * stream.h
 *	  What a connection reads and writes: a socket, or TLS over it.
 */
#ifndef RL_STREAM_H
#define RL_STREAM_H

#include "redis/socket.h"
#include "redis/tls.h"

typedef struct RedisStream
{
	RedisSocket socket;
	TlsSession	tls;
	bool		use_tls;
} RedisStream;

#define REDIS_STREAM_CLOSED {REDIS_SOCKET_CLOSED, {NULL, 0}, false}

extern bool stream_open(RedisStream *stream, const RedisEndpoint *endpoint, bool tls,
						int timeout_ms, int64 deadline, int64 *connect_deadline,
						RedisFailure *failure);
extern bool stream_is_open(const RedisStream *stream);
extern bool stream_idle_and_open(RedisStream *stream);
extern uint32 stream_wait(RedisStream *stream, uint32 events, int64 deadline);
extern ssize_t stream_send(RedisStream *stream, const char *data, size_t length);
extern ssize_t stream_receive(RedisStream *stream, char *buffer, size_t length);
extern void stream_close(RedisStream *stream);

#endif							/* RL_STREAM_H */
