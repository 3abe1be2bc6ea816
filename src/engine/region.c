/*
 * region.c
 *	  Where a policy whose budget spans regions decides (docs/regions.md):
 *
 *	  independent  in this server's Redis, as any policy: each region alone;
 *	  home         in the home region's Redis, a target of the pipeline;
 *	  split        a fixed window split in shares: every region but the home
 *	               one grants up to its base share of each window in its own
 *	               Redis, the home region the rest; a region whose share is
 *	               spent leases more of the rest from the home region's Redis
 *	               (the round trip there) and keeps what it did not need yet
 *	               in its own, for the rest of the window. Every token of a
 *	               window is counted once in one Redis, so all the regions
 *	               together grant at most the capacity.
 *
 * A lease grows with demand: it asks for as many tokens as the region leased
 * in the window so far (at least its share and the cost), so a region that
 * keeps coming back doubles what it holds each time, and one that does not
 * leaves the rest to the others.
 */
#include "prelude.h"

#include "algorithm/window.h"
#include "base/clock.h"
#include "engine/ask.h"
#include "engine/region.h"
#include "policy/placement.h"
#include "redis/regions.h"
#include "scripts.h"

static const LuaScript share_script = LUA_SCRIPT("region/share_one", script_region_share_one);
static const LuaScript lease_script = LUA_SCRIPT("region/lease_one", script_region_lease_one);
static const LuaScript deposit_script = LUA_SCRIPT("region/deposit_one", script_region_deposit_one);

/* The share reply's six numbers: a take's four, then short and the tokens leased. */
#define SHARE_RESULTS 6

/* True when request is a take of a split policy: this file makes it. */
bool
region_splits(const DecisionRequest *request)
{
	return request->policy.region_mode == REGION_MODE_SPLIT && request->mode == LIMIT_TAKE;
}

/* The window's key and numbers for request at at_ms (the fixed window's take). */
static void
window_part(const DecisionRequest *request, const char *key, int64 at_ms, LimitCall *part)
{
	const LimitParams *params = &request->policy.bucket;

	limit_ops(params)->call(params, LIMIT_TAKE, key, request->cost, at_ms, NULL, part);
}

/*
 * The take of a split policy in this region's Redis: from its share of the
 * window (the home region: the rest), else from what it holds of a lease.
 */
void
region_share_call(const DecisionRequest *request, const char *key, int64 at_ms, RedisCall *call)
{
	const Policy *policy = &request->policy;
	LimitCall	part = {0};

	window_part(request, key, at_ms, &part);
	part.script = &share_script;
	part.args[0] = window_number(placement_share(policy));
	if (!placement_is_home(policy))
		part.keys[part.nkeys++] = psprintf("%s:lease", part.keys[0]);
	ask_call_of(&part, NULL, 0, SHARE_RESULTS, call);
	call->target = 0;
}

/* Runs one call; false, with the call's own failure in it, when it was not answered. */
static bool
run_one(RedisCall *call)
{
	RedisFailure failure;

	return redis_run_scripts(call, 1, 0, &failure);
}

/*
 * After the share's reply (call answered): when the share and the lease
 * lacked the cost, leases tokens from the home region and keeps what the
 * take does not need here. Leaves call's first four results as a take's
 * reply; a home region that cannot answer leaves call unanswered, with its
 * failure, for the fail mode.
 */
void
region_share_finish(const DecisionRequest *request, const char *key, int64 at_ms, RedisCall *call)
{
	const Policy *policy = &request->policy;
	LimitCall	part = {0};
	int64		most;
	RedisCall	lease;
	int64		asked_us = clock_monotonic_us();
	long long  *results = call->results;
	int64		taken;
	int64		left;

	if (results[4] < 0 || results[4] > 1 || results[5] < 0 || results[5] > policy->bucket.capacity ||
		results[1] < 0 || results[1] > 2 * policy->bucket.capacity)
	{
		call->answered = false;
		redis_fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		return;
	}
	/* From here the reply is a take's: its four numbers. */
	call->nresults = 4;
	if (results[4] != 1)
		return;
	window_part(request, key, at_ms, &part);
	most = Min(Max(Max(request->cost, (int64) results[5]), Max(placement_base_share(policy), 1)),
			   placement_home_rest(policy));
	most = Max(most, request->cost);
	part.script = &lease_script;
	part.args[0] = window_number(placement_home_rest(policy));
	ask_call_of(&part, &most, 1, 4, &lease);
	lease.target = placement_target_of_home(policy);
	if (!run_one(&lease))
	{
		call->answered = false;
		call->failure = lease.failure;
		call->retry_after_ms = lease.retry_after_ms;
		return;
	}
	taken = lease.results[0];
	if (taken < 0 || taken > placement_home_rest(policy) || (taken > 0 && taken < request->cost))
	{
		call->answered = false;
		redis_fail(&call->failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
		call->failure.target = lease.target;	/* the home region's reply */
		return;
	}
	if (taken == 0)
	{
		/* The home region has nothing left for this window: denied until it ends. */
		results[0] = 0;
		results[2] = lease.results[2];
		results[3] = lease.results[3];
		return;
	}
	results[0] = 1;
	results[1] += taken - request->cost;
	results[2] = 0;
	/* The window's time left as this server chose it (the home region only echoes it). */
	left = Min((int64) lease.results[3], (int64) results[3]) - (clock_monotonic_us() - asked_us + 999) / 1000;
	if (taken > request->cost && left > 0)
	{
		/* Kept for the rest of the window (lost, never granted twice, if Redis cannot keep it). */
		LimitCall	keep = {0};
		int64		numbers[3] = {taken - request->cost, taken, left};
		RedisCall	deposit;

		keep.script = &deposit_script;
		keep.keys[keep.nkeys++] = psprintf("%s:lease", part.keys[0]);
		ask_call_of(&keep, numbers, 3, 1, &deposit);
		(void) run_one(&deposit);
	}
}
