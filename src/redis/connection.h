/*
 * connection.h
 *	  One Redis connection per node (cluster.h) and backend, opened lazily,
 *	  used without ever blocking: what pipeline.c needs of it.
 */
#ifndef RL_CONNECTION_H
#define RL_CONNECTION_H

#include "base/script.h"
#include "redis/exchange.h"

#include "redis/stream.h"

/* The scripts one connection has sent; more room than there are scripts. */
#define SENT_SCRIPTS_MAX 64

typedef struct RedisConnection
{
	RedisStream stream;
	char	   *url;			/* the ratelimit.redis_url it was opened with */
	uint32		epoch;			/* cluster_epoch() when it was opened */
	bool		busy;			/* a request is under way (or was cut off) */
	bool		untrusted;		/* Redis sent bytes no request asked for */
	int64		last_used_us;	/* when its last request ended */
	char		node[300];		/* the node it is connected to, for rl_health ("" none) */
	uint32		tls_generation; /* tls_settings_generation() when it was opened */
	/* A connection found through Sentinel: the master's address, when to ask again. */
	bool		sentinel;
	char		master_host[256];
	int			master_port;
	int64		next_check_us;
	/* Scripts sent on it: Redis has them cached, unless it restarted or flushed them. */
	const LuaScript *sent_scripts[SENT_SCRIPTS_MAX];
	int			sent_script_count;
	/* ratelimit.redis_connections = shared: the node as the worker is told it (handoff.h). */
	char	   *shared_url;		/* the URL it was found with; NULL: not yet */
	uint32		shared_epoch;	/* cluster_epoch() then */
	const char *shared_host;	/* NULL: the URL's own node */
	char		shared_host_buffer[256];
	int			shared_port;
	int			shared_channel; /* the channel that last carried its exchange; -1 none */
	bool		shared_too_large;	/* its last reply did not fit: the next exchange goes on its own */
	uint64		shared_generation;	/* of the connection that answered it */
} RedisConnection;


/* A backend's connections, by node */
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

/* One connection, as a shared connection's worker keeps it */
extern RedisConnection *connection_create(void);
extern bool connection_connect(RedisConnection *connection, const char *url, int target,
							   const char *host, int port, int64 deadline, RedisFailure *failure);
/*
 * A backend's connection idle this long is checked (one recv with MSG_PEEK)
 * before a request, so that one Redis closed meanwhile (a restart, CLIENT
 * KILL, its idle timeout) is opened again before anything is sent. One that
 * answered within the last millisecond is not: the answer proved it as well
 * as a check would (a close in that millisecond races with the write as one
 * after the check would), and a busy backend saves a system call per
 * decision.
 */
#define CONNECTION_IDLE_CHECK_US 1000

extern bool connection_ready(RedisConnection *connection, const char *url, int64 check_idle_us,
							 int64 deadline);
extern bool connection_run(RedisConnection *connection, int nreplies, int64 deadline,
						   int64 idle_us, ExchangeReplyHandler handler, void *arg,
						   RedisFailure *failure);
extern void connection_close(RedisConnection *connection);
extern const char *connection_address(const RedisConnection *connection);

#endif							/* RL_CONNECTION_H */
