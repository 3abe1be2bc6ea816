/*
 * connection.h
 *	  One Redis connection per backend, opened lazily, used without ever
 *	  blocking: what pipeline.c needs of it.
 */
#ifndef RL_CONNECTION_H
#define RL_CONNECTION_H

#include "lib/stringinfo.h"

#include "redis/failure.h"
#include "redis/resp.h"

/* Handles one reply of an exchange: index is its place among the replies awaited. */
typedef void (*ConnectionReplyHandler) (int index, const RespValue *reply, void *arg);

extern void connection_init(void);
extern bool connection_open(int64 deadline, bool *opened, RedisFailure *failure);
extern StringInfo connection_output(void);
extern void connection_begin(void);
extern bool connection_exchange(int nreplies, int64 deadline, ConnectionReplyHandler handler,
								void *arg, RedisFailure *failure);
extern void connection_done(void);

#endif							/* RL_CONNECTION_H */
