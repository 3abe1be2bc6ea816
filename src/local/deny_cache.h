/*
 * deny_cache.h
 *	  Denials remembered from Redis in shared memory until their retry-after.
 */
#ifndef RL_DENY_CACHE_H
#define RL_DENY_CACHE_H

#include "algorithm/limit.h"
#include "local/table.h"

/* A denial remembered: what Redis answered, and until when it holds. */
typedef struct DenyEntry
{
	int64		cost;			/* the cost denied: the same is denied again */
	int64		remaining;
	int64		until_ms;		/* this server's clock: when the cost could be granted */
	int64		reset_until_ms;
} DenyEntry;

extern SharedTable deny_cache_table;

extern bool deny_cache_available(void);
extern bool deny_cache_find(const LocalKey *key, int64 cost, bool larger, int64 now_ms,
							DenyEntry *entry);
extern void deny_cache_remember(const LocalKey *key, const DenyEntry *entry, int64 asked_us);
extern void deny_cache_forget(const LocalKey *key);

#endif							/* RL_DENY_CACHE_H */
