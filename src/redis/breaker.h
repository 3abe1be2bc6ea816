/*
 * breaker.h
 *	  Remembers that Redis is down, so that decisions stop waiting for it.
 */
#ifndef RL_BREAKER_H
#define RL_BREAKER_H

#include "datatype/timestamp.h"

#include "redis/cluster.h"
#include "redis/failure.h"

/* The breaker of one node. */
typedef struct BreakerState BreakerState;

/* What rl_health() shows of a breaker. */
typedef struct BreakerHealth
{
	char		node[REDIS_NODE_NAME];	/* its node, "" for the URL's one node */
	bool		reachable;		/* the last attempt got an answer */
	bool		open;			/* decisions skip Redis until the next probe */
	TimestampTz since;			/* when reachable last changed (0: never tried) */
	int64		retry_in_ms;	/* until the next probe, when open */
	RedisFailure last_failure;	/* the last failure seen, kind NONE if none yet */
	TimestampTz last_failure_at;	/* when (0: never) */
	bool		shared;			/* kept in shared memory for the whole server */
} BreakerHealth;

extern int	breaker_retry_interval_ms;

extern void breaker_init(void);
extern Size breaker_shmem_size(void);
extern void breaker_shmem_init(void);
extern BreakerState *breaker_for(const char *node);
extern bool breaker_begin(BreakerState *state, bool *probing);
extern void breaker_weigh(int node, RedisFailure *failure);
extern void breaker_end(BreakerState *state, const RedisFailure *failure);
extern void breaker_abandon(BreakerState *state);
extern int64 breaker_retry_after_ms(BreakerState *state);
extern bool breaker_is_open(BreakerState *state);
extern int	breaker_server_command_timeout_ms(void);
extern int	breaker_node_count(void);
extern bool breaker_health(int i, BreakerHealth *health);

#endif							/* RL_BREAKER_H */
