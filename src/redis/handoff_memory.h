/*
 * handoff_memory.h
 *	  The shared memory of ratelimit.redis_connections = shared: what the
 *	  backends (handoff.c) and the workers (worker.c) both read and write,
 *	  under handoff_shared->lock. handoff.c says how a slot goes.
 */
#ifndef RL_HANDOFF_MEMORY_H
#define RL_HANDOFF_MEMORY_H

#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lwlock.h"

#include "redis/handoff.h"

/* The most nodes (of every target and URL together) with a shared connection. */
#define HANDOFF_CHANNELS 64
#define HANDOFF_URL_MAX 1024
#define HANDOFF_HOST_MAX 256
#define HANDOFF_TLS_MAX 2048
/* A worker without a request this long gives its channel and connection back. */
#define HANDOFF_IDLE_EXIT_US ((int64) 600 * 1000 * 1000)

typedef enum SlotState
{
	SLOT_FREE,
	SLOT_QUEUED,
	SLOT_SENT,
	SLOT_DONE,
	SLOT_ABANDONED
} SlotState;

typedef struct HandoffSlot
{
	volatile SlotState state;
	int			channel;
	uint64		ticket;
	Latch	   *latch;			/* the backend's */
	int			nreplies;
	int64		command_us;
	int64		idle_us;
	int			request_length;
	int			reply_length;
	int			replies;		/* whole replies in reply: nreplies, fewer with a failure */
	uint64		generation;		/* of the connection that answered */
	RedisFailure failure;		/* kind NONE: every reply came */
	char		request[HANDOFF_REQUEST_MAX];
	char		reply[HANDOFF_REPLY_MAX];
} HandoffSlot;

typedef struct HandoffChannel
{
	bool		used;
	uint32		incarnation;	/* bumped each time it is taken: its worker's (bgw_extra) */
	char		url[HANDOFF_URL_MAX];
	char		tls[HANDOFF_TLS_MAX];	/* the TLS settings its backends use */
	int			target;
	char		host[HANDOFF_HOST_MAX]; /* "": the URL's own node */
	int			port;
	Latch	   *worker_latch;	/* NULL: no worker running now */
	bool		in_round;		/* the worker runs a round: it takes the queue after it, unwoken */
	bool		connected;
	uint64		generation;		/* bumped at each connection the worker opens */
	uint64		discard;		/* the connection of this generation is to be closed */
	pg_atomic_uint64 progress_us;	/* when Redis last sent a reply on it */
	int64		last_request_us;
	char		node[300];		/* as rl_health shows it */
	int			nqueued;		/* slot numbers, oldest first, in queues */
} HandoffChannel;

typedef struct HandoffShared
{
	LWLock	   *lock;
	uint64		boot;			/* drawn at each start of the shared memory: a worker of an earlier one ends */
	int64		no_worker_until_us; /* a worker could not be started: none tried again before */
	int			nslots;
	HandoffChannel channels[HANDOFF_CHANNELS];
} HandoffShared;

extern HandoffShared *handoff_shared;
extern HandoffSlot *handoff_slots;
extern int *handoff_queues;		/* nslots per channel: its queued slots, oldest first */

/* What a worker is started with (bgw_extra): the channel as it was when it was started. */
typedef struct HandoffWorkerExtra
{
	uint64		boot;
	uint32		incarnation;
} HandoffWorkerExtra;

#define handoff_queue_of(channel) (&handoff_queues[(channel) * handoff_shared->nslots])

#endif							/* RL_HANDOFF_MEMORY_H */
