/*
 * connection.h
 *	  One Redis connection per backend, opened lazily, used without ever
 *	  blocking: what pipeline.c needs of it.
 */
#ifndef RL_CONNECTION_H
#define RL_CONNECTION_H

#include "redis/exchange.h"

extern void connection_init(void);
extern bool connection_open(int64 deadline, bool *opened, RedisFailure *failure);
extern StringInfo connection_output(void);
extern void connection_begin(void);
extern bool connection_exchange(int nreplies, int64 deadline, ExchangeReplyHandler handler,
								void *arg, RedisFailure *failure);
extern void connection_done(void);
extern void connection_discard(void);
extern const char *connection_node(void);

#endif							/* RL_CONNECTION_H */
