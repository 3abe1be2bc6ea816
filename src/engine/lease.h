/*
 * lease.h
 *	  Concurrency leases: at most `capacity` held at once, released with their
 *	  transaction or session.
 */
#ifndef RL_LEASE_H
#define RL_LEASE_H

#include "decision.h"

extern void lease_peek(const DecisionRequest *request, Decision *decision);

#endif							/* RL_LEASE_H */
