/*
 * lease.h
 *	  Concurrency leases: at most `capacity` held at once, released with their
 *	  transaction or session.
 */
#ifndef RL_LEASE_H
#define RL_LEASE_H

#include "engine/decision.h"

extern void lease_check_policy(const Policy *policy);
extern void lease_acquire(const DecisionRequest *request, bool session, int64 max_wait_ms,
						  Decision *decision);
extern bool lease_release(const DecisionRequest *request);
extern void lease_peek(const DecisionRequest *request, Decision *decision);
extern void lease_peek_many(const DecisionRequest *requests, Decision *decisions, int count);

#endif							/* RL_LEASE_H */
