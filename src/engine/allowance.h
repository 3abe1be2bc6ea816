/*
 * allowance.h
 *	  Allowances: a hot subject's takes granted from this server's slice of
 *	  its tokens.
 */
#ifndef RL_ALLOWANCE_H
#define RL_ALLOWANCE_H

#include "engine/request.h"
#include "local/slices.h"
#include "redis/failure.h"

/* What one take does about its subject's slice, from before Redis is asked to after. */
typedef struct AllowancePlan
{
	const DecisionRequest *request;	/* NULL: the take cannot use a slice */
	SliceAsk	ask;
	SliceOutcome outcome;		/* SLICE_NONE also when the take cannot use a slice */
	uint32		ticket;			/* SLICE_FETCH: the fetch's */
	int64		want;			/* SLICE_FETCH: the most tokens to take */
	int64		taken;			/* SLICE_FETCH: what Redis took */
	int64		at_ms;			/* the take's time (a window's) */
} AllowancePlan;

extern bool allowance_grant(const DecisionRequest *request, const LocalKey *key, int64 at_ms,
							bool may_fetch, AllowancePlan *plan, SliceGrant *grant);
extern SliceOutcome allowance_plan(AllowancePlan *plan, SliceGrant *grant, SliceGiveBack *backs,
								   int *nbacks);
extern void allowance_wait(const AllowancePlan *plan);
extern bool allowance_reply(AllowancePlan *plan, const long long *results,
							RedisFailure *failure);
extern bool allowance_after(AllowancePlan *plan, const char *redis_key, bool answered,
							bool allowed, int64 *remaining, int64 reset_after_ms,
							SliceGiveBack *back);
extern void allowance_abandon(const AllowancePlan *plan);

#endif							/* RL_ALLOWANCE_H */
