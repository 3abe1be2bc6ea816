/*
 * observer.h
 *	  What the engine reports as it goes, to the observation layer above it
 *	  (statistics, the health and decision logs), which registers here.
 */
#ifndef RL_OBSERVER_H
#define RL_OBSERVER_H

#include "engine/decision.h"

typedef struct EngineObserver
{
	/* One call to Redis made for policy: answered or why not, and its round trip (-1: none). */
	void		(*redis_call) (const Policy *policy, bool answered, const RedisFailure *failure,
							   int64 round_trip_us);
	/* One call that gave back what a transaction or session held (the ledger logs its own losses). */
	void		(*settle_call) (const char *policy_name, bool answered, const RedisFailure *failure,
								int64 round_trip_us);
	/* One decision that spends (a take, a lease); cost is what it asked for. */
	void		(*decision) (const DecisionRequest *request, const Decision *decision, int64 cost);
} EngineObserver;

extern EngineObserver engine_observer;

extern void engine_observe_redis(const Policy *policy, bool answered, const RedisFailure *failure,
								 int64 round_trip_us);
extern void engine_observe_settle(const char *policy_name, bool answered,
								  const RedisFailure *failure, int64 round_trip_us);
extern void engine_observe_decision(const DecisionRequest *request, const Decision *decision,
									int64 cost);

#endif							/* RL_OBSERVER_H */
