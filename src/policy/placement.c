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
