/*
 * group.h
 *	  Several checks (a tenant's and a user's, say) decided in one atomic step:
 *	  all granted or none charged.
 */
#ifndef RL_GROUP_H
#define RL_GROUP_H

#include "engine/decision.h"

/* The most checks in one group. */
#define GROUP_MAX_CHECKS 32

extern void group_check(const DecisionRequest *requests, int last);
extern void group_run(DecisionRequest *requests, Decision *decisions, int count);

#endif							/* RL_GROUP_H */
