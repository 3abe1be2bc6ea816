/*
 * targets.c
 *	  Script calls, each run in the Redis of its target: this server's own
 *	  (ratelimit.redis_url) or a region's (regions.c). The calls of one target
 *	  go in one pipeline (pipeline.c); the targets one after another.
 */
#include "prelude.h"

#include "redis/pipeline.h"
#include "redis/regions.h"

/*
 * Runs the calls of one target (regions.h) in its Redis, and afterwards
 * sends to this server's own again, even when an error cuts the run short.
 */
static bool
run_in_target(int target, RedisCall *calls, int ncalls, int command_timeout_ms,
			  RedisFailure *failure)
{
	volatile bool answered;

	/*
	 * Every run says its target, this server's too: a backend that an exit
	 * cut short in another's (FATAL runs no PG_FINALLY) is not left there.
	 */
	if (!regions_use(target))
	{
		/* The list changed since the call was made: that region is gone. */
		for (int i = 0; i < ncalls; i++)
		{
			calls[i].answered = false;
			calls[i].round_trip_us = -1;
			calls[i].retry_after_ms = 0;
			redis_fail(&calls[i].failure, REDIS_FAILURE_CONFIG,
					   "the call's region is no longer in ratelimit.regions");
			calls[i].failure.target = target;
		}
		*failure = calls[0].failure;
		return false;
	}
	if (target == 0)
		return pipeline_run(calls, ncalls, command_timeout_ms, failure);
	PG_TRY();
	{
		answered = pipeline_run(calls, ncalls, command_timeout_ms, failure);
	}
	PG_FINALLY();
	{
		(void) regions_use(0);
	}
	PG_END_TRY();
	/* What failed says where: the health lines name the region. */
	failure->target = target;
	for (int i = 0; i < ncalls; i++)
		calls[i].failure.target = target;
	return answered;
}

/*
 * Runs calls, each in the Redis of its target (RedisCall.target): the calls
 * of one target in one pipeline, the targets one after another, each within
 * its own deadline. False, with the first failure, unless every call was
 * answered.
 */
bool
redis_run_scripts(RedisCall *calls, int ncalls, int command_timeout_ms, RedisFailure *failure)
{
	int			first = calls[0].target;
	bool		mixed = false;
	bool		all = true;
	bool		done[REDIS_MAX_TARGETS] = {0};

	for (int i = 1; i < ncalls; i++)
	{
		Assert(calls[i].target >= 0 && calls[i].target < REDIS_MAX_TARGETS);
		mixed |= calls[i].target != first;
	}
	if (!mixed)
		return run_in_target(first, calls, ncalls, command_timeout_ms, failure);

	memset(failure, 0, sizeof(*failure));
	for (int i = 0; i < ncalls; i++)
	{
		int			target = calls[i].target;
		RedisCall  *some;
		int			n = 0;
		RedisFailure why;

		if (done[target])
			continue;
		done[target] = true;
		some = palloc(ncalls * sizeof(RedisCall));
		for (int j = i; j < ncalls; j++)
			if (calls[j].target == target)
				some[n++] = calls[j];
		(void) run_in_target(target, some, n, command_timeout_ms, &why);
		n = 0;
		for (int j = i; j < ncalls; j++)
			if (calls[j].target == target)
				calls[j] = some[n++];
		pfree(some);
	}
	for (int i = 0; i < ncalls; i++)
		if (!calls[i].answered && all)
		{
			*failure = calls[i].failure;
			all = false;
		}
	return all;
}
