/*
 * socket.h
 *	  A socket to Redis: opened without blocking, waited on with the latch,
 *	  read and written as far as it takes.
 */
#ifndef RL_SOCKET_H
#define RL_SOCKET_H

#include "storage/latch.h"

#include "redis/failure.h"

/* Where to connect: a unix socket (path), or host and port. */
typedef struct RedisEndpoint
{
	const char *path;			/* NULL: TCP */
	const char *host;
	int			port;
} RedisEndpoint;

/* One socket, and the wait event set it is waited on with. */
typedef struct RedisSocket
{
	pgsocket	sock;			/* PGINVALID_SOCKET: not connected */
	WaitEventSet *wait_set;
	int			event;			/* the socket's position in wait_set */
} RedisSocket;

#define REDIS_SOCKET_CLOSED {PGINVALID_SOCKET, NULL, 0}

extern bool socket_open(RedisSocket *rs, const RedisEndpoint *endpoint, int timeout_ms,
						int64 deadline, int64 *connect_deadline, RedisFailure *failure);
extern bool socket_is_open(const RedisSocket *rs);
extern bool socket_idle_and_open(RedisSocket *rs);
extern bool socket_wait_abandoned(void);
extern void socket_check_interrupts(void);
extern uint32 socket_wait_event(void);
extern uint32 socket_wait(RedisSocket *rs, uint32 events, int64 deadline);
extern ssize_t socket_send(RedisSocket *rs, const char *data, size_t length);
extern ssize_t socket_receive(RedisSocket *rs, char *buffer, size_t length);
extern void socket_close(RedisSocket *rs);
extern void socket_forget_address(void);

#endif							/* RL_SOCKET_H */
