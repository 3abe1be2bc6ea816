/*
 * observe.c
 *	  The observation layer: defines its settings and subscribes to what the
 *	  engine reports (engine/observer.h), handing each report to the
 *	  statistics, the top subjects, the health lines and the decision log.
 */
#include "prelude.h"

#include "engine/observer.h"
#include "observe/decision_log.h"
#include "observe/health.h"
#include "observe/observe.h"
#include "observe/stats.h"
#include "observe/top.h"

/* A decision's call to Redis: counted, and its health noted. */
static void
observe_redis_call(const Policy *policy, bool answered, const RedisFailure *failure,
				   int64 round_trip_us)
{
	stats_redis(policy->name, answered, failure, round_trip_us);
	health_note(policy, answered, failure);
}

/* A call that gave back what a transaction held: counted (the ledger logs its losses). */
static void
observe_settle_call(const char *policy_name, bool answered, const RedisFailure *failure,
					int64 round_trip_us)
{
	stats_redis(policy_name, answered, failure, round_trip_us);
}

/* A decision that spends: counted, summarised by subject, and logged if the settings choose it. */
static void
observe_decision(const DecisionRequest *request, const Decision *decision, int64 cost)
{
	stats_decision(decision, cost);
	top_decision(decision, cost, request->subject, request->length);
	decision_log(decision, cost, request->subject, request->length);
}

/* The shared memory of the statistics and the summaries (when preloaded). */
Size
observe_shmem_size(void)
{
	return add_size(stats_shmem_size(), top_shmem_size());
}

void
observe_shmem_request(void)
{
	stats_shmem_request();
	top_shmem_request();
}

void
observe_shmem_init(void)
{
	stats_shmem_init();
	top_shmem_init();
}

void
observe_init(bool preloaded)
{
	stats_init(preloaded);
	top_init(preloaded);
	decision_log_init();
	engine_observer.redis_call = observe_redis_call;
	engine_observer.settle_call = observe_settle_call;
	engine_observer.decision = observe_decision;
}
