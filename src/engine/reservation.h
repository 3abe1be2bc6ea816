/*
 * reservation.h
 *	  Budget that follows the transaction: rl_reserve's tokens come back on rollback.
 */
#ifndef RL_RESERVATION_H
#define RL_RESERVATION_H

#include "engine/decision.h"

extern void reservation_take(const DecisionRequest *request, Decision *decision);
extern void reservation_settle(const DecisionRequest *request, int64 cost, int64 actual,
							   Decision *decision);
extern void reservation_take_many(const DecisionRequest *requests, Decision *decisions,
								  int count);

#endif							/* RL_RESERVATION_H */
