/*
 * health.c
 *	  The health lines of the server log: a Redis failure at most once per
 *	  class and ratelimit.retry_interval (base/log_limit.c), and that Redis
 *	  answers again after a failure was logged.
 *
 * Never a key or a subject: the statement (which may hold the subject) is kept
 * out of every line.
 */
#include "prelude.h"

#include "base/log_limit.h"
#include "observe/health.h"
#include "policy/placement.h"
#include "redis/breaker.h"
#include "redis/regions.h"

/* Per Redis (regions.h): whether a failure line was logged since its last "answers again". */
static bool failure_logged[REDIS_MAX_TARGETS];

/* Notes a Redis call made for policy: answered, or why not. */
void
health_note(const Policy *policy, bool answered, const RedisFailure *failure)
{
	char		line_class[256];
	int64		held_back;
	char	   *held_back_text;
	/* A region's Redis is named: "ratelimit: Redis of region "us" cannot answer". */
	int			target = failure->kind == REDIS_FAILURE_NONE ? placement_target(policy) : failure->target;
	const char *of = target > 0 ? psprintf(" of region \"%s\"", regions_name_of(target)) : "";

	/* A call the breaker skipped says nothing new. */
	if (!answered && failure->kind == REDIS_FAILURE_NONE)
		return;
	if (failure->kind == REDIS_FAILURE_NONE)
	{
		if (failure_logged[target])
			ereport(LOG,
					(errhidestmt(true),
					 errhidecontext(true),
					 errmsg("ratelimit: Redis%s answers again", of),
					 errdetail("Policy \"%s\" was decided by Redis.", policy->name)));
		failure_logged[target] = false;
		return;
	}
	/* One line per class, Redis and node (a cluster's), not per decision. */
	snprintf(line_class, sizeof(line_class), "redis %s: %s %d %s",
			 redis_failure_kind_name(failure->kind), failure->detail, target, failure->node);
	if (!log_limit_allow(line_class, breaker_retry_interval_ms, &held_back))
		return;
	failure_logged[target] = true;
	held_back_text = held_back == 0 ? "" :
		psprintf(" " INT64_FORMAT " more like it were not logged since the last one.", held_back);
	if (failure->kind == REDIS_FAILURE_PERMISSION)
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis%s refused a command: the ACL of its user does not allow %s (permission)", of,
						failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" while Redis refuses.%s",
						   policy->name, policy_fail_mode_name(policy->fail_mode), held_back_text),
				 errhint("Give the Redis user the commands and keys the documentation lists.")));
	else if (failure->kind == REDIS_FAILURE_AUTH)
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: Redis%s refuses to serve without the right password (authentication: %s)", of,
						failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" until Redis answers.%s",
						   policy->name, policy_fail_mode_name(policy->fail_mode), held_back_text),
				 errhint("Write the password of the Redis user in the file ratelimit.redis_password_file names (or in ratelimit.redis_url), then reload.")));
	else
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 failure->node[0] == '\0' ?
				 errmsg("ratelimit: Redis%s cannot answer (%s: %s)", of,
						redis_failure_kind_name(failure->kind), failure->detail) :
				 errmsg("ratelimit: Redis%s node %s cannot answer (%s: %s)", of, failure->node,
						redis_failure_kind_name(failure->kind), failure->detail),
				 errdetail("Policy \"%s\" decides by its fail mode \"%s\" until Redis answers.%s",
						   policy->name, policy_fail_mode_name(policy->fail_mode), held_back_text)));
}
