/*
 * placement.h
 *	  Which Redis a policy's calls go to (placement.c).
 */
#ifndef RL_PLACEMENT_H
#define RL_PLACEMENT_H

#include "policy/policy.h"

extern int	placement_target(const Policy *policy);
extern int	placement_target_of_home(const Policy *policy);
extern void placement_refuse_split(const Policy *policy, const char *what);
extern bool placement_is_home(const Policy *policy);
extern int64 placement_base_share(const Policy *policy);
extern int64 placement_home_rest(const Policy *policy);
extern int64 placement_share(const Policy *policy);

#endif							/* RL_PLACEMENT_H */
