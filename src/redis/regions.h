/*
 * regions.h
 *	  The regions a budget may span: this server's (ratelimit.region) and every
 *	  region's Redis (ratelimit.regions), as targets the pipeline can send to.
 */
#ifndef RL_REGIONS_H
#define RL_REGIONS_H

#include "redis/url.h"

/* Target 0 is this server's own Redis (ratelimit.redis_url); 1.. the regions listed. */
#define REGIONS_MAX (REDIS_MAX_TARGETS - 1)
#define REGION_NAME_LEN 64

extern void regions_init(void);
extern const char *regions_own(void);
extern int	regions_count(void);
extern int	regions_total(void);
extern int	regions_target_of(const char *name);
extern bool regions_use(int target);
extern int	regions_slots(void);
extern const char *regions_name_of(int target);

#endif							/* RL_REGIONS_H */
