/*
 * request.c
 *	  One call's checked arguments: the policy (with the subject's override
 *	  applied), the subject, the cost, what to do with the bucket.
 *
 * The contract's errors for bad input come from here, before anything is
 * asked of Redis: an unknown policy (42704), an empty or oversized subject or
 * a cost outside 1 .. capacity (22023), a policy outside the supported bounds
 * (23514), a call that has no meaning for the policy's algorithm (42809).
 */
#include "prelude.h"

#include "miscadmin.h"

#include "base/clock.h"
#include "policy/cache.h"
#include "policy/placement.h"
#include "policy/subject.h"
#include "engine/request.h"
#include "utils/timestamp.h"

/*
 * Checks a policy name and a subject into request (the rest of it zeroed) and
 * returns the cached policy: the contract's errors for an unknown or unusable
 * policy and a bad subject. function_oid is the calling SQL function.
 */
const Policy *
request_check(Oid function_oid, const char *name, const char *subject, int length,
			  DecisionRequest *request)
{
	const Policy *policy = policy_lookup(function_oid, name);

	if (policy == NULL)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("rate limit policy \"%s\" does not exist", name),
				 errhint("The policies are the rows of rl_policy: see SELECT name FROM rl_policy, or create one with rl_define.")));
	subject_check(subject, length);
	memset(request, 0, sizeof(*request));
	request->policy = *policy;	/* a copy: the cache may be reloaded later */
	request->subject = subject;
	request->length = length;
	policy_apply_override(&request->policy, subject, length);
	policy = &request->policy;
	if (!policy->usable)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_CHECK_VIOLATION),
				 errmsg("rate limit policy \"%s\" is outside the supported bounds", policy->name),
				 errdetail("With g = gcd(refill_amount, refill_period in ms), capacity * period_ms / g + refill_amount / g must stay below 2^53."),
				 errhint("Restore the table's constraints and correct the policy.")));
	request->target = placement_target(policy);
	return policy;
}

/*
 * Sets a checked request's mode and cost (a refund's amount): token buckets
 * only, except for a peek, and a cost between 1 and the capacity (with
 * rollover, and the most it carries; a refund's amount is capped there
 * instead).
 */
void
request_cost(DecisionRequest *request, LimitMode mode, int64 cost)
{
	const Policy *policy = &request->policy;
	const char *amount_name = mode == LIMIT_REFUND ? "amount" : "cost";
	/* A window with rollover may hold the capacity and what it carried over. */
	int64		most = policy_most_cost(policy);

	if (policy->algorithm == ALGORITHM_CONCURRENCY && mode != LIMIT_PEEK)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("rate limit policy \"%s\" is a concurrency policy", policy->name),
				 errhint("Take its leases with rl_acquire and give them back with rl_release.")));
	if (policy->algorithm == ALGORITHM_CONCURRENCY && cost != 1)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a peek at concurrency policy \"%s\" counts one lease", policy->name),
				 errdetail("The cost was " INT64_FORMAT ".", cost),
				 errhint("Peek with a cost of 1, or omit the cost.")));
	if (mode == LIMIT_REFUND && cost > most)
		cost = most;
	if (cost <= 0 || cost > most)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 1 and the capacity of policy \"%s\" (" INT64_FORMAT ")",
						amount_name, policy->name, most),
				 errdetail("The %s was " INT64_FORMAT ".", amount_name, cost),
				 errhint("Ask for at most the capacity, or raise the policy's capacity in rl_policy.")));
	request->mode = mode;
	request->cost = cost;
}


/*
 * The time request is decided at: the one fixed in advance (a reservation's
 * refund goes to its take's window), else now.
 */
int64
request_at_ms(const DecisionRequest *request)
{
	return request->at_ms != 0 ? request->at_ms : clock_now_ms();
}

/*
 * Lets a checked take wait up to max_wait for its cost (rl_consume's
 * max_wait, rl_acquire's): a booking, so only for algorithms that have a later time of
 * their own; at most REQUEST_MAX_WAIT_MS; 0 is no wait.
 */
void
request_wait(DecisionRequest *request, const Interval *max_wait)
{
	const Policy *policy = &request->policy;
	int64		ms;

	if (max_wait->month == 0 && max_wait->day == 0 && max_wait->time == 0)
		return;
	if (max_wait->month != 0 || max_wait->day < 0 || max_wait->time < 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_wait must be a positive interval of at most a day"),
				 errhint("Pass a wait such as '3 seconds', or NULL not to wait.")));
	ms = (int64) max_wait->day * 24 * 60 * 60 * 1000 + (max_wait->time + 999) / 1000;
	if (ms > REQUEST_MAX_WAIT_MS)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_wait must be a positive interval of at most a day"),
				 errdetail("It was " INT64_FORMAT " ms.", ms),
				 errhint("Pass a shorter wait, or NULL not to wait.")));
	if (!limit_books(policy->algorithm) && policy->algorithm != ALGORITHM_CONCURRENCY)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("rate limit policy \"%s\" cannot book a wait", policy->name),
				 errdetail("A %s has no later time of its own to book.",
						   limit_algorithm_name(policy->algorithm)),
				 errhint("Wait with token_bucket, gcra or fixed_window policies (concurrency: rl_acquire's max_wait), or retry after retry_after_ms.")));
	if (policy->bucket.rollover > 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("rate limit policy \"%s\" cannot book a wait", policy->name),
				 errdetail("A window with rollover has no limit for the next window until this one is over."),
				 errhint("Retry after retry_after_ms, or set the policy's rollover to NULL to wait.")));
	placement_refuse_split(policy, "max_wait");
	request->max_wait_ms = ms;
}

/*
 * Makes a checked take once per id (rl_consume's request_id): a retry with the
 * same id gets the first grant again and takes nothing. Redis is told the id's
 * keyed hash, never the id.
 */
void
request_once(DecisionRequest *request, const char *id, int length)
{
	StringInfoData hash;

	if (length == 0 || length > REQUEST_ID_MAX_BYTES)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("request_id must have 1 to %d bytes", REQUEST_ID_MAX_BYTES),
				 errdetail("This one has %d.", length),
				 errhint("Pass the request's own id (an Idempotency-Key, a job id), or NULL for none.")));
	placement_refuse_split(&request->policy, "request_id");
	initStringInfo(&hash);
	subject_hash(&hash, id, length);
	request->request_id = hash.data;
}
