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
	LEASE_PEEK
} LeaseOperation;

/* The arguments of each script: the clock, then capacity, lease TTL and the lease id. */
#define CONCURRENCY_ARGS 4

extern const LuaScript *concurrency_script(LeaseOperation operation);
extern void concurrency_args(int64 capacity, int64 ttl_ms, const char *id, const char **args);

#endif							/* RL_CONCURRENCY_H */
