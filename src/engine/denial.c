/*
 * denial.c
 *	  What the deny cache (local/deny_cache.c) answers for a take, and what it
 *	  learns from Redis's answers and from refunds made here.
 */
#include "prelude.h"

#include "base/clock.h"
#include "engine/denial.h"
#include "local/deny_cache.h"
#include "redis/url.h"

/*
 * True when request's policy remembers denials and this server can. Not on
 * the test clock: tests decide at exact times, which a cache that runs on the
 * server's clock would blur (test/t/195 tests it on the real clock). Not for
 * a session that set a Redis of its own: the cache is the server's, and
 * speaks of the server's Redis.
 */
static bool
deny_cache_usable(const DecisionRequest *request)
{
	return request->policy.deny_cache && deny_cache_available() && clock_test_ms()[0] == '\0' &&
		redis_url_is_server_wide();
}

/*
 * How much longer than a denied cost's wait a larger cost, more tokens,
 * waits, when that can be told without Redis: a refilling algorithm adds
 * the time to refill them (rounded up: at most 1 ms over the wait Redis
 * would say), a fixed window none (it waits for the window's end); -1 for
 * the sliding algorithms, whose wait depends on what they counted when.
 */
static int64
longer_wait_ms(const LimitParams *params, int64 more)
{
	if (params->algorithm == ALGORITHM_FIXED_WINDOW)
		return 0;
	if (!limit_refills(params->algorithm) || params->rate <= 0)
		return -1;
	/* more is at most the capacity: more * unit <= capacity_units < 2^53. */
	return (more * params->unit + params->rate - 1) / params->rate;
}

/*
 * For a take (of the subject at key) of a cost Redis denied lately (or a
 * larger one, when its wait can be told: longer_wait_ms), whose retry-after
 * has not passed at now_ms, this server's clock: fills decision with that denial and the time still to
 * wait, and returns true. Redis is not asked.
 */
bool
denial_answer(const DecisionRequest *request, const LocalKey *key, int64 now_ms,
			  Decision *decision)
{
	DenyEntry	entry;
	int64		longer = 0;
	bool		larger_ok;

	if (request->mode != LIMIT_TAKE || !deny_cache_usable(request))
		return false;
	larger_ok = longer_wait_ms(&request->policy.bucket, 1) >= 0;
	if (!deny_cache_find(key, request->cost, larger_ok, now_ms, &entry))
		return false;
	if (request->cost > entry.cost)
		longer = longer_wait_ms(&request->policy.bucket, request->cost - entry.cost);
	decision->allowed = false;
	decision->remaining = entry.remaining;
	decision->retry_after_ms = entry.until_ms - now_ms + longer;
	decision->reset_after_ms = Max(entry.reset_until_ms - now_ms, decision->retry_after_ms);
	decision->source = DECISION_SOURCE_DENY_CACHE;
	return true;
}

/*
 * After Redis gave request's amount back (a refund, a reservation rolled
 * back): a denial remembered for its subject is forgotten, and one decided
 * before it is not remembered after it (local/deny_cache.c).
 */
void
denial_forget(const DecisionRequest *request, const LocalKey *key)
{
	if (deny_cache_usable(request))
		deny_cache_forget(key);
}

/*
 * After Redis decided request (of the subject at key; a take sent at
 * asked_us, clock_monotonic_us):
 * a denial with a retry-after is remembered, for no longer than the policy
 * could make anyone wait (a bucket's full refill, a window), whatever the
 * reply said; a refund (given back here) forgets what was remembered.
 */
void
denial_learn(const DecisionRequest *request, const LocalKey *key, const Decision *decision,
			 int64 asked_us)
{
	if (request->mode == LIMIT_REFUND)
		denial_forget(request, key);
	if (!deny_cache_usable(request))
		return;
	if (request->mode == LIMIT_TAKE && decision->source == DECISION_SOURCE_REDIS &&
		!decision->allowed && decision->retry_after_ms > 0)
	{
		const LimitParams *params = &request->policy.bucket;
		int64		longest = limit_ops(params)->full_ms(params) + 1;
		int64		now_ms = clock_now_ms();
		DenyEntry	entry = {
			.cost = request->cost,
			.remaining = decision->remaining,
			.until_ms = now_ms + Min(decision->retry_after_ms, longest),
			.reset_until_ms = now_ms + Min(decision->reset_after_ms, longest),
		};

		deny_cache_remember(key, &entry, asked_us);
	}
}

