/*
 * connection.h
 *	  One Redis connection per node (cluster.h) and backend, opened lazily,
 *	  used without ever blocking: what pipeline.c needs of it.
 */
#ifndef RL_CONNECTION_H
#define RL_CONNECTION_H

#include "base/script.h"
#include "redis/exchange.h"

extern void connection_init(void);
extern bool connection_open(int node, int64 deadline, bool *opened, RedisFailure *failure);
extern StringInfo connection_output(void);
extern void connection_begin(int node);
extern bool connection_exchange(int node, int nreplies, int64 deadline, int64 idle_us,
								ExchangeReplyHandler handler, void *arg, RedisFailure *failure);
extern bool connection_ask(int node, int argc, const char *const *argv, int64 deadline,
						   ExchangeReplyHandler handler, void *arg);
extern void connection_done(int node);
extern void connection_discard(int node);
extern void connection_close_stale(void);
extern bool connection_script_sent(int node, const LuaScript *script);
extern const char *connection_node(int node);

#endif							/* RL_CONNECTION_H */
