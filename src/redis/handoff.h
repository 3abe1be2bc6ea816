/*
 * handoff.h
 *	  ratelimit.redis_connections = shared: a backend hands its exchange with a
 *	  Redis node to the server's one connection to it, kept by a background
 *	  worker (worker.c), through shared memory, and waits on its latch.
 */
#ifndef RL_HANDOFF_H
#define RL_HANDOFF_H

#include "lib/stringinfo.h"

#include "redis/exchange.h"
#include "redis/failure.h"

/* The most bytes of commands one handed-off exchange carries (more: the backend's own). */
#define HANDOFF_REQUEST_MAX 16384
/* The most bytes of replies one handed-off exchange may receive. */
#define HANDOFF_REPLY_MAX 32768

/* The failure's detail of a reply too large to hand back (the next exchange goes on the backend's own). */
#define HANDOFF_REPLY_TOO_LARGE "reply too large to share"

/* One exchange the worker takes from the queue: whose, and what it asks. */
typedef struct HandoffRequest
{
	int			slot;
	uint64		ticket;
	int			nreplies;
	int64		command_us;		/* how long its replies may take, once sent */
	int64		idle_us;		/* the most between two bytes from Redis (0: no bound) */
} HandoffRequest;

/* What the worker hands back for one request. */
typedef struct HandoffAnswer
{
	const char *replies;		/* whole replies, as Redis sent them */
	int			length;
	int			count;			/* of them */
	int			fitting;		/* of them within HANDOFF_REPLY_MAX bytes */
	int			fitting_length;
	RedisFailure failure;		/* kind NONE: every reply came */
} HandoffAnswer;

/* A node as a backend names it: its target's URL, and its address (host NULL: the URL's own). */
typedef struct HandoffNode
{
	const char *url;
	const char *tls;			/* the backend's TLS settings (tls_settings_text) */
	int			target;
	const char *host;
	int			port;
} HandoffNode;

typedef enum HandoffOutcome
{
	HANDOFF_DONE,				/* every reply handed to the handler */
	HANDOFF_FAILED,				/* not: failure says why */
	HANDOFF_NONE,				/* no shared connection: the backend's own takes it */
	HANDOFF_TOO_LARGE			/* more than HANDOFF_REQUEST_MAX: the backend's own, just for it */
} HandoffOutcome;

/* Backend side */
extern void handoff_init(void);
extern Size handoff_shmem_size(void);
extern void handoff_shmem_request(void);
extern void handoff_shmem_init(void);
extern bool handoff_enabled(void);
extern HandoffOutcome handoff_exchange(const HandoffNode *node, StringInfo request, int nreplies,
									   int64 deadline, int64 idle_us,
									   ExchangeReplyHandler handler, void *arg, int *channel,
									   uint64 *generation, RedisFailure *failure);
extern void handoff_discard(int channel, uint64 generation);
extern void handoff_node(int channel, char *node, size_t size);

#endif							/* RL_HANDOFF_H */
