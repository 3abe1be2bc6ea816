/*
 * placement.c
 *	  Which Redis a policy's calls go to: this server's, or, for a policy
 *	  whose budget spans regions (region_mode), its home region's
 *	  (redis/regions.c names the regions; engine/region.c decides a split
 *	  policy's takes).
 */
#include "prelude.h"

#include "policy/placement.h"
#include "redis/regions.h"

/* Raises unless the policy's home region is one this server can reach. */
int
placement_target_of_home(const Policy *policy)
{
	int			target = regions_target_of(policy->home_region);

	if (target < 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the home region \"%s\" of rate limit policy \"%s\" is not in ratelimit.regions",
						policy->home_region, policy->name),
				 errhint("List every region as name=url in ratelimit.regions (and this server's in ratelimit.region), then reload.")));
	return target;
}

/*
 * The target a policy's calls go to (0: this server's Redis). Raises when
 * the policy names a region this server does not know.
 */
int
placement_target(const Policy *policy)
{
	switch (policy->region_mode)
	{
		case REGION_MODE_HOME:
			return placement_target_of_home(policy);
		case REGION_MODE_SPLIT:
			if (regions_own()[0] == '\0')
				ereport(ERROR,
						(errhidestmt(true),
						 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
						 errmsg("rate limit policy \"%s\" splits its budget across regions, and this server has none",
								policy->name),
						 errhint("Set ratelimit.region to this server's region (and list every region in ratelimit.regions), then reload.")));
			(void) placement_target_of_home(policy);
			return 0;
		default:
			return 0;
	}
}

/*
 * Raises for what a split policy cannot do (max_wait, request_id, a group):
 * its takes are made from shares and leases, not by the fixed window's scripts.
 */
void
placement_refuse_split(const Policy *policy, const char *what)
{
	if (policy->region_mode != REGION_MODE_SPLIT)
		return;
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("rate limit policy \"%s\" splits its budget across regions: %s is not supported",
					policy->name, what),
			 errhint("Use region_mode 'home' for this policy, or call without %s.", what)));
}

/* True when this server is in a split policy's home region. */
bool
placement_is_home(const Policy *policy)
{
	return strcmp(regions_own(), policy->home_region) == 0;
}

/*
 * Each region's share of a split window but the home one's: region_base
 * (NULL: capacity / 2N), never so much that the others' shares together pass
 * the capacity (a 'limit' override's capacity too).
 */
int64
placement_base_share(const Policy *policy)
{
	int64		capacity = policy->bucket.capacity;
	int			others = Max(regions_total() - 1, 1);

	if (policy->region_base >= 0)
		return Min(policy->region_base, capacity / others);
	return capacity / (2 * Max(regions_total(), 1));
}

/* The home region's rest of a split window: what the other regions' shares leave. */
int64
placement_home_rest(const Policy *policy)
{
	int64		others = (int64) Max(regions_total() - 1, 0) * placement_base_share(policy);

	return Max(policy->bucket.capacity - others, 0);
}

/* What this server's region grants of a split window alone: its share, or the home region's rest. */
int64
placement_share(const Policy *policy)
{
	return placement_is_home(policy) ? placement_home_rest(policy) : placement_base_share(policy);
}
