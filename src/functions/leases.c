/*
 * leases.c
 *	  The lease functions of concurrency policies: rl_acquire and rl_release
 *	  (rl_peek is in decide.c).
 */
#include "prelude.h"

#include "utils/builtins.h"

#include "utils/timestamp.h"

#include "base/log_privacy.h"
#include "engine/lease.h"
#include "functions/args.h"

/* Checks the (policy, subject) arguments of fcinfo into request: a concurrency policy. */
static void
lease_arguments(FunctionCallInfo fcinfo, DecisionRequest *request)
{
	lease_check_policy(args_policy_subject(fcinfo, request));
}

/*
 * rl_acquire(policy, subject, scope DEFAULT 'transaction'): takes one lease,
 * released when the transaction (or, with 'session', the session) ends.
 */
RL_SQL_FUNCTION(rl_acquire)
{
	DecisionRequest request;
	Decision	decision;
	char	   *scope;

	lease_arguments(fcinfo, &request);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be null"),
				 errhint("Pass 'transaction' or 'session', or omit it for 'transaction'.")));
	scope = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(scope, "transaction") != 0 && strcmp(scope, "session") != 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("scope must be 'transaction' or 'session'"),
				 errhint("A 'transaction' lease is released when the transaction ends, a 'session' one by rl_release or at disconnect.")));
	/* Since 0.10: max_wait (NULL: no wait). */
	if (PG_NARGS() > 3 && !PG_ARGISNULL(3))
		request_wait(&request, PG_GETARG_INTERVAL_P(3));
	lease_acquire(&request, strcmp(scope, "session") == 0, request.max_wait_ms, &decision);
	return args_decision_datum(fcinfo, &decision);
}

/*
 * rl_release(policy, subject): gives back the latest lease this session holds
 * for them; true when a lease was released in Redis.
 */
RL_SQL_FUNCTION(rl_release)
{
	DecisionRequest request;

	lease_arguments(fcinfo, &request);
	PG_RETURN_BOOL(lease_release(&request));
}
