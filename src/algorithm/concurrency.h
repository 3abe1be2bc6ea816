/*
 * concurrency.h
 *	  Concurrency leases: at most `capacity` held at once per subject, each
 *	  expiring by itself. Only Redis counts them, so this is their scripts.
 */
#ifndef RL_CONCURRENCY_H
#define RL_CONCURRENCY_H

#include "base/script.h"

/* What a call does to a lease set: one script each. */
typedef enum LeaseOperation
{
	LEASE_ACQUIRE,
	LEASE_RELEASE,
	LEASE_PEEK,
	LEASE_LEAVE					/* a waiter leaves the queue */
} LeaseOperation;

/*
 * The arguments of each script: the clock, then capacity, lease TTL, the lease
 * id, the waiter's ticket and how long a ticket lives unrenewed.
 */
#define CONCURRENCY_ARGS 6
/* The keys: the lease set, the queue's tickets, their expiries. */
#define CONCURRENCY_KEYS 3

extern const LuaScript *concurrency_script(LeaseOperation operation);
extern void concurrency_args(int64 capacity, int64 ttl_ms, const char *id, const char *ticket,
							 int64 ticket_ttl_ms, const char **args);
extern void concurrency_keys(const char *key, const char **keys);

#endif							/* RL_CONCURRENCY_H */
