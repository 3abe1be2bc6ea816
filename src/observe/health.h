/*
 * health.h
 *	  The health lines of the server log: Redis cannot answer, and answers again.
 */
#ifndef RL_HEALTH_H
#define RL_HEALTH_H

#include "policy/policy.h"
#include "redis/failure.h"

extern void health_note(const Policy *policy, bool answered, const RedisFailure *failure);

#endif							/* RL_HEALTH_H */
