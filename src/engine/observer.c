/*
 * observer.c
 *	  What the engine reports as it goes, to the observation layer above it
 *	  (statistics, the health and decision logs), which registers here. The
 *	  engine calls down only: what it reports goes up through these pointers.
 */
#include "prelude.h"

#include "engine/observer.h"

EngineObserver engine_observer = {0};

/* Reports one call to Redis: see EngineObserver. A call the breaker skipped is reported too. */
void
engine_observe_redis(const Policy *policy, bool answered, const RedisFailure *failure,
					 int64 round_trip_us)
{
	if (engine_observer.redis_call)
		engine_observer.redis_call(policy, answered, failure, round_trip_us);
}

/* Reports one call of the ledger's. */
void
engine_observe_settle(const char *policy_name, bool answered, const RedisFailure *failure,
					  int64 round_trip_us)
{
	if (engine_observer.settle_call)
		engine_observer.settle_call(policy_name, answered, failure, round_trip_us);
}

/* Reports one decision that spends. */
void
engine_observe_decision(const DecisionRequest *request, const Decision *decision, int64 cost)
{
	if (engine_observer.decision)
		engine_observer.decision(request, decision, cost);
}
