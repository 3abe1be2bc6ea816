/*
 * decide.c
 *	  The token-bucket functions: rl_consume, rl_enforce, rl_reserve, rl_peek,
 *	  rl_refund and rl_reset. Each checks its arguments, hands the request to
 *	  the engine and returns what it decided.
 */
#include "prelude.h"

#include "base/log_privacy.h"
#include "engine/decide.h"
#include "engine/lease.h"
#include "engine/reservation.h"
#include "functions/args.h"
#include "functions/enforce.h"

/* Logs an administrative action on a policy: the policy and the action, never the subject. */
static void
audit(const char *action, const char *policy)
{
	ereport(LOG,
			(errhidestmt(true),
			 errhidecontext(true),
			 errmsg("ratelimit: %s on policy \"%s\"", action, policy)));
}

/* rl_consume(policy, subject, cost): one atomic decision; tokens taken only if allowed. */
RL_SQL_FUNCTION(rl_consume)
{
	DecisionRequest request;
	Decision	decision;

	args_request(fcinfo, LIMIT_TAKE, &request);
	decision_run(&request, &decision);
	return args_decision_datum(fcinfo, &decision);
}

/*
 * rl_enforce(policy, subject, cost): rl_consume, but a denial raises RL429 (over
 * quota) or RL503 (Redis unavailable and the policy fails closed).
 */
RL_SQL_FUNCTION(rl_enforce)
{
	DecisionRequest request;
	Decision	decision;

	args_request(fcinfo, LIMIT_TAKE, &request);
	decision_run(&request, &decision);
	enforce(fcinfo->flinfo->fn_oid, &decision);
	return args_decision_datum(fcinfo, &decision);
}

/* rl_reserve(policy, subject, cost): rl_consume, refunded if its (sub)transaction rolls back. */
RL_SQL_FUNCTION(rl_reserve)
{
	DecisionRequest request;
	Decision	decision;

	args_request(fcinfo, LIMIT_TAKE, &request);
	reservation_take(&request, &decision);
	return args_decision_datum(fcinfo, &decision);
}

/* rl_peek(policy, subject, cost): the decision rl_consume (or rl_acquire) would make, taking nothing. */
RL_SQL_FUNCTION(rl_peek)
{
	DecisionRequest request;
	Decision	decision;

	args_request(fcinfo, LIMIT_PEEK, &request);
	if (request.policy.algorithm == ALGORITHM_CONCURRENCY)
		lease_peek(&request, &decision);
	else
		decision_run(&request, &decision);
	return args_decision_datum(fcinfo, &decision);
}

/* rl_refund(policy, subject, amount): gives tokens back, never above capacity. */
RL_SQL_FUNCTION(rl_refund)
{
	DecisionRequest request;
	Decision	decision;

	args_request(fcinfo, LIMIT_REFUND, &request);
	decision_run(&request, &decision);
	audit("refund", decision.policy);
	return args_decision_datum(fcinfo, &decision);
}

/* rl_reset(policy, subject): a full bucket; false when Redis could not answer. */
RL_SQL_FUNCTION(rl_reset)
{
	DecisionRequest request;
	bool		done;

	args_request(fcinfo, LIMIT_PEEK, &request);
	done = decision_reset(&request);
	audit("reset", request.policy.name);
	PG_RETURN_BOOL(done);
}

/*
 * rl_settle(policy, subject, cost, actual): settles a take of cost tokens
 * (rl_reserve's or rl_consume's) to what it really cost (reservation.c).
 */
RL_SQL_FUNCTION(rl_settle)
{
	DecisionRequest request;
	Decision	decision;
	int64		actual;

	if (PG_ARGISNULL(3) && !PG_ARGISNULL(0) && !PG_ARGISNULL(1) && !PG_ARGISNULL(2))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("actual must not be null"),
				 errhint("Pass what the work really cost, in tokens (0 when it cost nothing).")));
	if (PG_ARGISNULL(2) && !PG_ARGISNULL(0) && !PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("cost must not be null"),
				 errhint("Pass the cost the take asked for.")));
	args_policy_subject(fcinfo, &request);
	request_cost(&request, LIMIT_TAKE, PG_GETARG_INT64(2));
	actual = PG_GETARG_INT64(3);
	if (actual < 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("actual must not be negative"),
				 errdetail("It was " INT64_FORMAT ".", actual),
				 errhint("Pass what the work really cost, in tokens (0 when it cost nothing).")));
	reservation_settle(&request, request.cost, actual, &decision);
	return args_decision_datum(fcinfo, &decision);
}
