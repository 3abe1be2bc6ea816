/*
 * allowance.c
 *	  Allowances: when a subject is hot on this server, one Redis call takes a
 *	  slice of its tokens (never more than its bucket holds, at most the
 *	  policy's allowance) into shared memory (local/slices.c), and its takes
 *	  are granted there, with source 'allowance', until the slice is spent or
 *	  its allowance_ttl is up; what is left is given back to Redis.
 *
 * Every token granted here was taken from the bucket in Redis first, so the
 * servers that share a bucket never grant more than it holds in total. What
 * a slice costs the others is that its tokens are counted when they were
 * taken, not when they are granted: at most one slice per subject and server
 * (the allowance) is parked that way, for at most allowance_ttl, and a fixed
 * window's slice lives no longer than its window (the sliding algorithms,
 * which weigh each token by when it was counted, have no allowances).
 *
 * A fetch that finds the bucket holding less than it asked for (or none)
 * starves the subject for allowance_ttl (a window's: until its end at most): its takes then ask Redis for their
 * cost alone, as without an allowance, since over its limit a fetch is one
 * take that the others would wait for, for nothing.
 *
 * The decision and batch paths (decision.c, batch.c) try the slice first
 * (allowance_grant), then, after the deny cache, plan what to ask Redis
 * (allowance_plan; a take alone may wait for another backend's fetch,
 * allowance_wait, and then tries the slice and the deny cache again; a batch
 * never fetches), send a slice's take in place of the cost's
 * (allowance_request) with the give-backs first in the same round trip, read
 * its reply (allowance_reply) and install the slice (allowance_after); an
 * error in between ends the fetch (allowance_abandon), and so does the
 * backend's exit (local/slices.c).
 */
#include "prelude.h"


#include "algorithm/window.h"
#include "base/clock.h"
#include "engine/allowance.h"
#include "redis/deadline.h"
#include "redis/url.h"

/* The time a take counts at: a window's (its request's), else now. */
static int64
take_time(const DecisionRequest *request)
{
	return limit_refills(request->policy.algorithm) ? clock_now_ms() : request_at_ms(request);
}

/*
 * Before Redis is asked for a checked take: true when the subject's live
 * slice here grants it (grant filled: the slice after it). Fills plan for
 * allowance_plan either way (outcome SLICE_NONE when the take cannot use a
 * slice); may_fetch says whether the take may fetch a new slice. request
 * must outlive plan.
 */
bool
allowance_grant(const DecisionRequest *request, bool may_fetch, AllowancePlan *plan,
				SliceGrant *grant)
{
	const Policy *policy = &request->policy;
	LocalKey	local_key;
	bool		alone;

	memset(plan, 0, sizeof(*plan));
	/* The slices are the server's: a session with a Redis of its own takes none. */
	if (request->mode != BUCKET_TAKE || policy->allowance <= 0 || !policy->usable ||
		!limit_slices(policy->algorithm) || !slices_available() ||
		request->refund_id != NULL || !redis_url_is_server_wide())
		return false;
	plan->request = request;
	plan->at_ms = take_time(request);
	local_key = request_local_key(request);
	plan->ask.key = local_key.hash;
	plan->ask.check = local_key.check;
	plan->ask.cost = request->cost;
	plan->ask.allowance = policy->allowance;
	plan->ask.ttl_ms = policy->allowance_ttl_ms;
	plan->ask.params = &policy->bucket;
	plan->ask.now_ms = plan->at_ms;
	plan->ask.may_fetch = may_fetch;
	/* A fetch is one call: others wait for it no longer than its deadline. */
	plan->ask.fetch_ms = (int64) deadline_connect_timeout_ms + deadline_command_timeout_ms;
	if (!slices_grant(&plan->ask, grant, &alone))
	{
		/* A starved subject's take is a plain one: no slice, no wait, no demand counted. */
		if (alone)
			memset(plan, 0, sizeof(*plan));
		return false;
	}
	plan->outcome = SLICE_GRANTED;
	return true;
}

/*
 * After allowance_grant did not grant (and no denial remembered holds):
 * SLICE_GRANTED when a slice that came meanwhile grants the take (grant
 * filled); SLICE_WAIT when another backend fetches the subject's slice
 * (allowance_wait waits for it; else the take asks Redis for its cost
 * alone); else plan says what to ask Redis (a slice to fetch, or the cost
 * alone), and backs holds the slices to give back first in the same round
 * trip.
 */
SliceOutcome
allowance_plan(AllowancePlan *plan, SliceGrant *grant, SliceGiveBack *backs, int *nbacks)
{
	SliceOutcome outcome;

	*nbacks = 0;
	if (plan->request == NULL)
		return SLICE_NONE;
	outcome = slices_take(&plan->ask, grant, &plan->ticket, &plan->want, backs, nbacks);
	plan->outcome = outcome == SLICE_WAIT ? SLICE_NONE : outcome;
	return outcome;
}

/*
 * Waits for the fetch of the subject's slice that allowance_plan found under
 * way (until it ends, at most its own deadline and a command_timeout).
 */
void
allowance_wait(const AllowancePlan *plan)
{
	slices_wait(plan->ask.key, plan->ticket, plan->ask.now_ms, Max(deadline_command_timeout_ms, 1));
}

/*
 * Turns sent (a copy of the take) into the slice's take when plan fetches
 * one; either way its window is the plan's (the one its slice counts in).
 */
void
allowance_request(const AllowancePlan *plan, DecisionRequest *sent)
{
	if (plan->request != NULL && !limit_refills(sent->policy.algorithm))
		sent->at_ms = plan->at_ms;
	if (plan->outcome != SLICE_FETCH)
		return;
	sent->mode = BUCKET_SLICE;
	sent->slice_most = plan->want;
}

/*
 * Reads a slice's reply, {tokens taken (0: denied), remaining, retry, reset},
 * into plan, leaving results as a take's; false (a protocol failure) when it
 * took less than the cost or more than was asked.
 */
bool
allowance_reply(AllowancePlan *plan, long long *results, RedisFailure *failure)
{
	if (plan->outcome != SLICE_FETCH)
		return true;
	if (results[0] != 0 && (results[0] < plan->ask.cost || results[0] > plan->want))
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	plan->taken = results[0];
	results[0] = plan->taken > 0;
	return true;
}

/* a + b for a time in ms, saturating. */
static int64
later(int64 a, int64 b)
{
	return a > PG_INT64_MAX - b ? PG_INT64_MAX : a + b;
}

/*
 * Until when a fetch that found the bucket short starves its subject:
 * allowance_ttl from the take, and a window's end at the latest (the next
 * window is full again).
 */
static int64
starved_until(const AllowancePlan *plan)
{
	int64		until = later(plan->ask.now_ms, plan->ask.ttl_ms);
	LimitWindow window;

	if (limit_refills(plan->ask.params->algorithm))
		return until;
	window_at(plan->ask.params, plan->at_ms, &window);
	return Min(until, window.end_ms);
}

/*
 * After Redis decided plan's take at redis_key: a fetched slice is installed
 * (its remaining, Redis's, then counts what the slice holds too), a take of
 * the cost alone counts in the subject's demand, a fetch that got nothing
 * ends. Returns true when the slice could not be installed (another fetch
 * took over): back is then to be given back at once.
 */
bool
allowance_after(AllowancePlan *plan, const char *redis_key, bool answered, bool allowed,
				int64 *remaining, int64 reset_after_ms, SliceGiveBack *back)
{
	SliceGrant	slice = {0};
	int64		now_ms = plan->ask.now_ms;

	if (plan->outcome != SLICE_FETCH)
	{
		if (plan->request != NULL && answered && allowed)
			slices_note(&plan->ask);
		return false;
	}
	plan->outcome = SLICE_NONE;
	if (!answered || !allowed)
	{
		slices_abandon(&plan->ask, plan->ticket, answered ? starved_until(plan) : 0);
		return false;
	}
	slice.left = plan->taken - plan->ask.cost;
	slice.remaining = *remaining;
	slice.reset_until_ms = later(now_ms, reset_after_ms);
	slice.usable_from_ms = PG_INT64_MIN;
	slice.usable_until_ms = later(now_ms, plan->ask.ttl_ms);
	slice.givable_until_ms = PG_INT64_MAX;
	if (!limit_refills(plan->ask.params->algorithm))
	{
		LimitWindow window;

		/* A window's tokens count in it alone: granted and given back only within it. */
		window_at(plan->ask.params, plan->at_ms, &window);
		slice.usable_from_ms = window.start_ms;
		slice.usable_until_ms = Min(slice.usable_until_ms, window.end_ms);
		slice.givable_until_ms = window.end_ms;
	}
	*remaining += slice.left;
	/* (SLICE_KEY_LEN holds the longest key there can be: see slices.h.) */
	plan->ask.redis_key = redis_key;
	if (slices_install(&plan->ask, plan->ticket, plan->at_ms, &slice,
					   plan->taken < plan->want ? starved_until(plan) : 0) != SLICE_MOVED_ON ||
		slice.left == 0 || take_time(plan->request) >= slice.givable_until_ms)
		return false;
	memset(back, 0, sizeof(*back));
	back->params = *plan->ask.params;
	strlcpy(back->key, redis_key, SLICE_KEY_LEN);
	back->tokens = slice.left;
	back->taken_ms = plan->at_ms;
	return true;
}

/* Ends plan's fetch, if any, without a slice (an error while Redis was asked). */
void
allowance_abandon(const AllowancePlan *plan)
{
	if (plan->outcome == SLICE_FETCH)
		slices_abandon(&plan->ask, plan->ticket, 0);
}

/* The refund that gives back's tokens back to the bucket (and window) they came from. */
void
allowance_give_back_request(const SliceGiveBack *back, DecisionRequest *request)
{
	memset(request, 0, sizeof(*request));
	request->policy.algorithm = back->params.algorithm;
	request->policy.bucket = back->params;
	request->policy.usable = true;
	request->key = back->key;
	request->cost = back->tokens;
	request->mode = BUCKET_REFUND;
	request->at_ms = back->taken_ms;
}
