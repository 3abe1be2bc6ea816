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
 * The pipeline (decide.c) calls these in its stages: allowance_grant,
 * allowance_plan and allowance_wait when it begins, allowance_reply and
 * allowance_after when it finishes, allowance_abandon on an error in
 * between (a backend's exit ends its fetches too: local/slices.c).
 */
#include "prelude.h"


#include "algorithm/window.h"
#include "base/clock.h"
#include "engine/allowance.h"
#include "redis/deadline.h"
#include "redis/url.h"

/*
 * Before Redis is asked for a checked take, counting at at_ms
 * (request_counts_at_ms), of the subject at key: true when the subject's
 * live slice here grants it (grant filled: the slice after it). Fills plan for
 * allowance_plan either way (outcome SLICE_NONE when the take cannot use a
 * slice); may_fetch says whether the take may fetch a new slice. request
 * must outlive plan.
 */
bool
allowance_grant(const DecisionRequest *request, const LocalKey *key, int64 at_ms, bool may_fetch,
				AllowancePlan *plan, SliceGrant *grant)
{
	const Policy *policy = &request->policy;
	bool		alone;

	memset(plan, 0, sizeof(*plan));
	/* The slices are the server's: a session with a Redis of its own takes none. */
	if (request->mode != LIMIT_TAKE || policy->allowance <= 0 || !policy->usable ||
		!limit_slices(policy->algorithm) || !slices_available() ||
		request->refund_id != NULL || !redis_url_is_server_wide())
		return false;
	plan->request = request;
	plan->at_ms = at_ms;
	plan->ask.key = *key;
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
	slices_wait(&plan->ask.key, plan->ticket, plan->ask.now_ms, Max(deadline_command_timeout_ms, 1));
}

/*
 * Checks a slice's reply, {tokens taken (0: denied), remaining, retry,
 * reset}, and keeps what it took in plan; false (a protocol failure) when it
 * took less than the cost or more than was asked.
 */
bool
allowance_reply(AllowancePlan *plan, const long long *results, RedisFailure *failure)
{
	if (plan->outcome != SLICE_FETCH)
		return true;
	if (results[0] != 0 && (results[0] < plan->ask.cost || results[0] > plan->want))
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	plan->taken = results[0];
	return true;
}

/* a + b, saturating at the largest time: a time in ms plus a duration. */
static int64
saturating_add(int64 a, int64 b)
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
	int64		until = saturating_add(plan->ask.now_ms, plan->ask.ttl_ms);
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
	slice.reset_until_ms = saturating_add(now_ms, reset_after_ms);
	slice.usable_from_ms = PG_INT64_MIN;
	slice.usable_until_ms = saturating_add(now_ms, plan->ask.ttl_ms);
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
		slice.left == 0 ||
		request_counts_at_ms(plan->request, clock_now_ms()) >= slice.givable_until_ms)
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

