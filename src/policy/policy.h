/*
 * policy.h
 *	  A policy: its row of rl_policy read into the form decisions use, and the
 *	  limits it decides under.
 */
#ifndef RL_POLICY_H
#define RL_POLICY_H

#include "access/attnum.h"
#include "datatype/timestamp.h"
#include "utils/hsearch.h"
#include "utils/relcache.h"
#include "utils/snapshot.h"

#include "algorithm/limit.h"

typedef enum FailMode
{
	FAIL_MODE_OPEN,
	FAIL_MODE_CLOSED,
	FAIL_MODE_LOCAL
} FailMode;

/* What a policy's decisions do: count and deny, count and only say so, or nothing. */
typedef enum PolicyMode
{
	POLICY_MODE_ENFORCE,
	POLICY_MODE_SHADOW,
	POLICY_MODE_DISABLED
} PolicyMode;

/* What an rl_override row does to its subject's decisions. */
typedef enum OverrideAction
{
	OVERRIDE_NONE,				/* no override: the policy's own limits */
	OVERRIDE_LIMIT,				/* other limits, in a bucket of their own */
	OVERRIDE_ALLOW,				/* always allowed, nothing counted */
	OVERRIDE_DENY				/* always denied, nothing counted */
} OverrideAction;

/* How a policy's budget spans regions (docs/regions.md). */
typedef enum RegionMode
{
	REGION_MODE_NONE,			/* NULL: this server's Redis */
	REGION_MODE_INDEPENDENT,	/* this server's Redis: each region alone */
	REGION_MODE_HOME,			/* the home region's Redis */
	REGION_MODE_SPLIT			/* each region's share, and leases of the home region's rest */
} RegionMode;

/* The replay_window column's default: how long a request id's grant is remembered. */
#define POLICY_REPLAY_WINDOW_MS (60 * 60 * 1000)

typedef struct Policy
{
	char		name[NAMEDATALEN];	/* hash key; the table allows at most 63 bytes */
	int32		version;
	/* The extension's installation (0 for one upgraded from 0.3): part of every key with version. */
	uint64		installation;
	Algorithm	algorithm;
	FailMode	fail_mode;
	PolicyMode	mode;
	bool		usable;			/* false: the row is outside the bucket's bounds */
	LimitParams bucket;		/* concurrency: only capacity and ttl_ms (the lease TTL) */
	/* The local fallback bucket: capacity (and refill) scaled by local_share. */
	bool		local_usable;
	LimitParams local_bucket;
	Interval	period;			/* the row's refill_period: a window algorithm's window */
	int64		idle_ttl_ms;	/* 0: null, the time to refill completely */
	bool		deny_cache;		/* denials from Redis are remembered until their retry-after */
	int64		allowance;		/* the most tokens of a hot subject one server slices (0: none) */
	int64		allowance_ttl_ms;	/* how long a slice may be used */
	int64		max_debt;		/* tokens a subject may owe past empty (-1: its capacity) */
	int64		replay_window_ms;	/* how long a request id's grant is remembered */
	int64		rollover;		/* fixed window: most unused tokens carried on (0: none) */
	double		local_share;
	RegionMode	region_mode;
	char		home_region[64];	/* home and split: the region that holds the budget */
	int64		region_base;	/* split: each other region's share of a window (-1: the default) */
	/* Set only on a request's copy, by policy_apply_override. */
	OverrideAction override;
	int64		override_retry_ms;	/* deny: until it expires */
} Policy;

extern int64 policy_interval_ms(Interval *interval);

/*
 * The most one take of policy (a request's copy) may cost: its capacity, and
 * for a fixed window with rollover what a window may carry over.
 */
static inline int64
policy_most_cost(const Policy *policy)
{
	return policy->bucket.capacity + policy->bucket.rollover;
}

/*
 * The tokens a subject of policy (a request's copy) may owe past empty:
 * max_debt, or its capacity; never so many that capacity and debt together
 * leave what the scripts hold exactly (the column's constraint says so for a
 * value; NULL, the capacity, is bounded here).
 */
static inline int64
policy_max_debt(const Policy *policy)
{
	const LimitParams *bucket = &policy->bucket;
	int64		debt = policy->max_debt < 0 ? bucket->capacity : policy->max_debt;
	int64		room = limit_refills(policy->algorithm) ?
		(BUCKET_EXACT_LIMIT - 1 - bucket->capacity_units - bucket->rate) / Max(bucket->unit, 1) :
		BUCKET_EXACT_LIMIT - 1 - bucket->capacity;

	return Max(Min(debt, room), 0);
}

extern const char *policy_fail_mode_name(FailMode mode);
extern AttrNumber policy_column(Relation rel, const char *column);
extern void policy_load_all(HTAB *cache, Oid relid, Snapshot snapshot, uint64 installation);
extern void policy_apply_limits(Policy *policy, int32 version, int64 capacity,
								int64 refill_amount, int64 period_ms);

#endif							/* RL_POLICY_H */
