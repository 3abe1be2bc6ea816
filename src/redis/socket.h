/*
 * socket.h
 *	  The one socket to Redis of a backend: opened without blocking, waited on
 *	  with the latch, read and written as far as it takes.
 */
#ifndef RL_SOCKET_H
#define RL_SOCKET_H

#include "redis/failure.h"
#include "redis/url.h"

extern bool socket_open(const RedisUrl *url, int timeout_ms, int64 deadline,
						int64 *connect_deadline, RedisFailure *failure);
extern bool socket_is_open(void);
extern bool socket_idle_and_open(void);
extern uint32 socket_wait(uint32 events, int64 deadline);
extern ssize_t socket_send(const char *data, size_t length);
extern ssize_t socket_receive(char *buffer, size_t length);
extern void socket_close(void);
extern void socket_forget_address(void);

#endif							/* RL_SOCKET_H */
