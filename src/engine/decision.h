/*
 * decision.h
 *	  One rate limit decision: an rl_decision's fields, and what says them
 *	  when Redis does not (decide.h asks Redis).
 */
#ifndef RL_DECISION_H
#define RL_DECISION_H

#include "engine/request.h"
#include "redis/failure.h"

/* Who made a decision: the rl_decision.source column. */
typedef enum DecisionSource
{
	DECISION_SOURCE_UNDECIDED,	/* not decided yet (decision_init) */
	DECISION_SOURCE_REDIS,
	DECISION_SOURCE_LOCAL,
	DECISION_SOURCE_FAIL_OPEN,
	DECISION_SOURCE_FAIL_CLOSED,
	DECISION_SOURCE_SHADOW,		/* a shadow policy would have denied: allowed anyway */
	DECISION_SOURCE_DISABLED,	/* a disabled policy: allowed, nothing counted */
	DECISION_SOURCE_OVERRIDE,	/* the subject's 'allow' or 'deny' override */
	DECISION_SOURCE_DENY_CACHE, /* a denial from Redis remembered until its retry-after */
	DECISION_SOURCE_ALLOWANCE,	/* granted from this server's slice of the subject's tokens */
	DECISION_SOURCE_REPLAY		/* a request id's first grant, answered again: nothing taken */
} DecisionSource;

#define DECISION_SOURCES (DECISION_SOURCE_REPLAY + 1)

typedef struct Decision
{
	bool		allowed;
	int64		remaining;
	int64		capacity;
	int64		retry_after_ms;
	int64		reset_after_ms;
	char		policy[NAMEDATALEN];
	int32		version;
	DecisionSource source;
	DecisionSource origin;		/* for source 'shadow': who would have denied */
	int64		wait_ms;		/* a grant booked this far ahead: waited for before it is given */
	int64		waited_ms;		/* how long the call waited (the waited_ms column) */
	int64		settled;		/* a settle (LIMIT_OWE): the tokens Redis took */
	/* Not "" when the script failed on the request's values (decision_raise_script_error). */
	char		script_error[128];
} Decision;

extern bool decision_local_possible(const DecisionRequest *request);
extern void decision_local(const DecisionRequest *request, const LocalKey *key, int64 at_ms,
						   LimitMode mode, Decision *decision);
extern void decision_refund_local(const DecisionRequest *request);
extern bool decision_script_failed(const Policy *policy, const RedisFailure *failure,
								   Decision *decision);
extern void decision_by_fail_mode(const DecisionRequest *request, const LocalKey *key,
								  int64 at_ms, int64 retry_after_ms, Decision *decision);
extern int64 decision_seconds_up(int64 ms);
extern int64 decision_retry_after_seconds(const Decision *decision);
extern const char *decision_source_name(DecisionSource source);

#endif							/* RL_DECISION_H */
