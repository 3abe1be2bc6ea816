/*
 * decide.h
 *	  Decisions as one pipeline: a take alone, or a batch in one round trip
 *	  per Redis node.
 */
#ifndef RL_DECIDE_H
#define RL_DECIDE_H

#include "engine/ask.h"
#include "engine/decision.h"
#include "redis/pipeline.h"

/* The most decisions in one batch (rl_consume_many, a statement's subjects). */
#define BATCH_MAX_DECISIONS 100000

extern void decision_init(const Policy *policy, Decision *decision);
extern bool decision_needs_no_bucket(const Policy *policy);
extern bool decision_fixed(const Policy *policy, Decision *decision);
extern void decision_shadow(const Policy *policy, Decision *decision);
extern void decision_raise_script_error(const Decision *decision);
extern void decision_run(const DecisionRequest *request, Decision *decision);
extern void batch_run(const DecisionRequest *requests, Decision *decisions, int count);
extern bool decision_reset(const DecisionRequest *request);

#endif							/* RL_DECIDE_H */
