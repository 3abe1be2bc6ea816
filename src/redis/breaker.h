/*
 * breaker.h
 *	  Remembers that Redis is down, so that decisions stop waiting for it.
 */
#ifndef RL_BREAKER_H
#define RL_BREAKER_H

#include "datatype/timestamp.h"

#include "redis/failure.h"

/* What rl_health() shows of the breaker. */
typedef struct BreakerHealth
{
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
extern bool breaker_call(bool (*attempt) (void *arg, RedisFailure *failure), void *arg,
						 RedisFailure *failure);
extern int64 breaker_retry_after_ms(void);
extern int	breaker_server_command_timeout_ms(void);
extern void breaker_health(BreakerHealth *health);

#endif							/* RL_BREAKER_H */
