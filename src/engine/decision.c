/*
 * decision.c
 *	  What a decision says when Redis could not decide it: the fail modes and
 *	  the local bucket, a script that failed on the request's values; and the
 *	  units and names a decision is shown in. The pipeline that decides is
 *	  decide.c.
 */
#include "prelude.h"

#include "base/clock.h"
#include "engine/decision.h"
#include "local/buckets.h"

/* True when the policy's local bucket can decide this request while Redis cannot. */
bool
decision_local_possible(const DecisionRequest *request)
{
	const Policy *policy = &request->policy;

	return policy->fail_mode == FAIL_MODE_LOCAL && local_available() &&
		policy->local_usable && request->cost <= policy->local_bucket.capacity;
}

/*
 * Applies request to its local bucket (key) in mode, at at_ms (the time it
 * counts at: request_counts_at_ms).
 */
void
decision_local(const DecisionRequest *request, const LocalKey *key, int64 at_ms, LimitMode mode,
			   Decision *decision)
{
	LimitResult result;
	const LimitParams *params = &request->policy.local_bucket;

	local_apply(params, key, at_ms, Min(request->cost, params->capacity), mode, &result);
	decision->allowed = result.allowed;
	decision->remaining = result.remaining;
	decision->retry_after_ms = result.retry_after_ms;
	decision->reset_after_ms = result.reset_after_ms;
	decision->source = DECISION_SOURCE_LOCAL;
}

/*
 * When Redis could not run the script on the request's own values (a Lua
 * error): decision is a denial that asked no fail mode, marked so that the
 * caller raises it (decision_raise_script_error) once what it must keep is
 * kept; true then. A fail mode stands in for Redis, never for an error the
 * request caused: 'open' would grant without counting, however often.
 */
bool
decision_script_failed(const Policy *policy, const RedisFailure *failure, Decision *decision)
{
	if (failure->kind != REDIS_FAILURE_SCRIPT)
		return false;
	decision->allowed = false;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
	strlcpy(decision->script_error, failure->detail, sizeof(decision->script_error));
	return true;
}

/*
 * Fills decision from the policy's fail mode, for when Redis could not
 * decide: 'open' allows, 'local' decides from the local bucket (key, at
 * at_ms) when one can, else (and 'closed') a denial until Redis is tried
 * again. A refund gives back nothing and a settle takes nothing: only a
 * bucket that can be reached can be refunded or owe.
 */
void
decision_by_fail_mode(const DecisionRequest *request, const LocalKey *key, int64 at_ms,
					  int64 retry_after_ms, Decision *decision)
{
	const Policy *policy = &request->policy;

	if (request->mode == LIMIT_REFUND || request->mode == LIMIT_OWE)
	{
		decision->allowed = false;
		decision->retry_after_ms = retry_after_ms;
		decision->source = DECISION_SOURCE_FAIL_CLOSED;
		return;
	}
	if (policy->fail_mode == FAIL_MODE_OPEN)
	{
		decision->allowed = true;
		decision->source = DECISION_SOURCE_FAIL_OPEN;
		return;
	}
	if (decision_local_possible(request))
	{
		decision_local(request, key, at_ms, request->mode, decision);
		return;
	}
	/* 'closed', and 'local' where no local bucket can decide (no preload, cost too high). */
	decision->allowed = false;
	decision->retry_after_ms = retry_after_ms;
	decision->reset_after_ms = decision->retry_after_ms;
	decision->source = DECISION_SOURCE_FAIL_CLOSED;
}

/* Gives a request's tokens back to its local bucket (a reservation granted there). */
void
decision_refund_local(const DecisionRequest *request)
{
	Decision	decision;
	LocalKey	key;

	if (!local_available() || !request->policy.local_usable)
		return;
	key = request_local_key(request);
	decision_local(request, &key, request_counts_at_ms(request, clock_now_ms()), LIMIT_REFUND,
				   &decision);
}

/*
 * Milliseconds as whole seconds, rounded up: a client told to wait less than
 * the bucket needs would only be denied again. Negative counts as 0.
 */
int64
decision_seconds_up(int64 ms)
{
	if (ms <= 0)
		return 0;
	/* Not (ms + 999) / 1000, which overflows near INT64_MAX. */
	return ms / 1000 + (ms % 1000 != 0);
}

/* A denial's retry-after in whole seconds: at least 1, since 0 invites an immediate retry. */
int64
decision_retry_after_seconds(const Decision *decision)
{
	return Max(decision_seconds_up(decision->retry_after_ms), 1);
}

/* The source column's text. */
const char *
decision_source_name(DecisionSource source)
{
	switch (source)
	{
		case DECISION_SOURCE_REDIS:
			return "redis";
		case DECISION_SOURCE_LOCAL:
			return "local";
		case DECISION_SOURCE_FAIL_OPEN:
			return "fail_open";
		case DECISION_SOURCE_SHADOW:
			return "shadow";
		case DECISION_SOURCE_DISABLED:
			return "disabled";
		case DECISION_SOURCE_OVERRIDE:
			return "override";
		case DECISION_SOURCE_DENY_CACHE:
			return "deny_cache";
		case DECISION_SOURCE_ALLOWANCE:
			return "allowance";
		case DECISION_SOURCE_REPLAY:
			return "replay";
		case DECISION_SOURCE_FAIL_CLOSED:
			return "fail_closed";
		case DECISION_SOURCE_UNDECIDED:
			break;
	}
	/* Every decision shown was made: an undecided one is a bug, shown as the safe answer. */
	Assert(false);
	return "fail_closed";
}
