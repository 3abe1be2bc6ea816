/*
 * request.h
 *	  One call's checked arguments: the policy (with the subject's override
 *	  applied), the subject, the cost, what to do with the bucket.
 */
#ifndef RL_REQUEST_H
#define RL_REQUEST_H

#include "local/keys.h"
#include "policy/policy.h"

typedef struct DecisionRequest
{
	Policy		policy;			/* a copy of the cached policy */
	const char *subject;		/* not NUL-terminated */
	int			length;
	int64		cost;			/* a refund's amount */
	LimitMode	mode;
	const char *refund_id;		/* refunds: done once per id, when set */
	const char *redis_key;		/* the Redis key, when fixed in advance; else built */
	int64		at_ms;			/* the time a window algorithm's window is chosen by; 0: now */
	int64		slice_most;		/* LIMIT_SLICE: the most tokens to take */
	int64		max_wait_ms;	/* a take: the longest wait it may book (0: none) */
	/* A take: made once per this id (its keyed hash); a refund: the take's id, forgotten. */
	const char *request_id;
	int			target;			/* the Redis its calls go to (engine/region.c): 0, this server's */
} DecisionRequest;

/* The longest max_wait a call may give: a day. */
#define REQUEST_MAX_WAIT_MS (INT64CONST(24) * 60 * 60 * 1000)
/* The longest request id, in bytes. */
#define REQUEST_ID_MAX_BYTES 256

extern const Policy *request_check(Oid function_oid, const char *name, const char *subject,
								   int length, DecisionRequest *request);
extern void request_cost(DecisionRequest *request, LimitMode mode, int64 cost);
extern int64 request_at_ms(const DecisionRequest *request);
extern void request_wait(DecisionRequest *request, const Interval *max_wait);
extern void request_once(DecisionRequest *request, const char *id, int length);

/*
 * The time request counts at, now being now_ms: a window algorithm's, the
 * request's own time (a refund goes to its take's window); a refilling
 * algorithm's, now (a bucket refills until now, and Redis's clock decides).
 */
static inline int64
request_counts_at_ms(const DecisionRequest *request, int64 now_ms)
{
	return limit_refills(request->policy.algorithm) || request->at_ms == 0 ? now_ms : request->at_ms;
}

/* The key of request's subject in this server's shared-memory tables (local/keys.c). */
static inline LocalKey
request_local_key(const DecisionRequest *request)
{
	const Policy *policy = &request->policy;

	return local_keys_of(policy->name, policy->version, policy->installation, request->subject,
						 request->length);
}

#endif							/* RL_REQUEST_H */
