/*
 * sentinel.h
 *	  Finding the master of a Sentinel URL.
 */
#ifndef RL_SENTINEL_H
#define RL_SENTINEL_H

#include "redis/failure.h"
#include "redis/url.h"

extern bool sentinel_find_master(const RedisUrl *url, int timeout_ms, int64 deadline,
								 RedisHostPort *master, RedisFailure *failure);

#endif							/* RL_SENTINEL_H */
