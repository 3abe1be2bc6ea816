/*
 * decision.h
 *	  One rate limit decision: a policy, a subject and a cost in; rl_decision out.
 */
#ifndef RL_DECISION_H
#define RL_DECISION_H

#include "fmgr.h"

#include "bucket.h"
#include "policy.h"
#include "redis.h"

/* Who made a decision: the rl_decision.source column. */
typedef enum DecisionSource
{
	DECISION_SOURCE_REDIS,
	DECISION_SOURCE_LOCAL,
	DECISION_SOURCE_FAIL_OPEN,
	DECISION_SOURCE_FAIL_CLOSED,
	DECISION_SOURCE_SHADOW,		/* a shadow policy would have denied: allowed anyway */
	DECISION_SOURCE_DISABLED,	/* a disabled policy: allowed, nothing counted */
	DECISION_SOURCE_OVERRIDE	/* the subject's 'allow' or 'deny' override */
} DecisionSource;

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
} Decision;

/* lua/token_bucket.lua, run by decision.c and multi.c, with 7 arguments per bucket. */
extern RedisScript token_bucket_script;
#define DECISION_SCRIPT_ARGS 7
typedef char ScriptNumbers[5][24];

/* One call's checked arguments. */
typedef struct DecisionRequest
{
	Policy		policy;			/* a copy of the cached policy */
	const char *subject;		/* not NUL-terminated */
	int			length;
	int64		cost;			/* a refund's amount */
	BucketMode	mode;
	const char *refund_id;		/* refunds: done once per id, when set */
	const char *key;			/* the Redis key, when fixed in advance; else built */
} DecisionRequest;

extern void decision_request_init(FunctionCallInfo fcinfo, BucketMode mode,
								  DecisionRequest *request);
extern const Policy *decision_request_check(Oid function_oid, const char *name,
											const char *subject, int length,
											DecisionRequest *request);
extern void decision_request_cost(DecisionRequest *request, BucketMode mode, int64 cost);
extern const Policy *decision_policy_subject(FunctionCallInfo fcinfo, DecisionRequest *request);
extern void decision_note_redis(const Policy *policy, bool answered, const RedisFailure *failure);
extern void decision_observe(const DecisionRequest *request, const Decision *decision, int64 cost);
extern const char *decision_source_name(DecisionSource source);
extern void decision_script_args(const DecisionRequest *request, ScriptNumbers numbers,
								 const char **args);
extern void decision_redis_call(const DecisionRequest *request, RedisCall *call);
extern void decision_init(const Policy *policy, Decision *decision);
extern void decision_run(const DecisionRequest *request, Decision *decision);
extern void decision_refund_local(const DecisionRequest *request);
extern bool decision_local_possible(const DecisionRequest *request);
extern void decision_local(const DecisionRequest *request, BucketMode mode, Decision *decision);
extern bool decision_reset(const DecisionRequest *request);
extern void decision_enforce(Oid function_oid, const Decision *decision);
extern bool decision_needs_no_bucket(const Policy *policy);
extern int64 decision_seconds_up(int64 ms);
extern int64 decision_retry_after_seconds(const Decision *decision);

/* How rl_enforce words a denial (palloc'd texts). */
typedef struct DecisionDenial
{
	bool		unavailable;	/* RL503: Redis could not answer, the policy fails closed */
	char	   *message;
	char	   *detail;
	char	   *hint;
} DecisionDenial;

extern void decision_denial(const Decision *decision, DecisionDenial *denial);
extern bool decision_fixed(const Policy *policy, Decision *decision);
extern void decision_shadow(const Policy *policy, Decision *decision);
extern bool decision_from_reply(const long long *results, Decision *decision,
								RedisFailure *failure);
extern void decision_make(FunctionCallInfo fcinfo, BucketMode mode, Decision *decision);
extern Datum decision_to_datum(FunctionCallInfo fcinfo, const Decision *decision);
extern void decision_to_values(const Decision *decision, Datum *values);

#endif							/* RL_DECISION_H */
