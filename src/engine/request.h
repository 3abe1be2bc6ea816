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
	BucketMode	mode;
	const char *refund_id;		/* refunds: done once per id, when set */
	const char *key;			/* the Redis key, when fixed in advance; else built */
	int64		at_ms;			/* the time a window algorithm's window is chosen by; 0: now */
	int64		slice_most;		/* BUCKET_SLICE: the most tokens to take */
} DecisionRequest;

extern const Policy *request_check(Oid function_oid, const char *name, const char *subject,
								   int length, DecisionRequest *request);
extern void request_cost(DecisionRequest *request, BucketMode mode, int64 cost);
extern int64 request_at_ms(const DecisionRequest *request);
extern int64 request_counts_at_ms(const DecisionRequest *request, int64 now_ms);
extern LocalKey request_local_key(const DecisionRequest *request);

#endif							/* RL_REQUEST_H */
