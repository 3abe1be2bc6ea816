/*
 * region.h
 *	  Where a policy whose budget spans regions decides (region.c).
 */
#ifndef RL_REGION_H
#define RL_REGION_H

#include "engine/request.h"
#include "redis/pipeline.h"

extern bool region_splits(const DecisionRequest *request);
extern void region_share_call(const DecisionRequest *request, const char *key, int64 at_ms,
							  RedisCall *call);
extern void region_share_finish(const DecisionRequest *request, const char *key, int64 at_ms,
								RedisCall *call);

#endif							/* RL_REGION_H */
