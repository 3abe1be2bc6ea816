/*
 * batch.h
 *	  Independent decisions in one round trip per Redis node.
 */
#ifndef RL_BATCH_H
#define RL_BATCH_H

#include "engine/decision.h"

/* The most decisions in one batch (rl_consume_many, a statement's subjects). */
#define BATCH_MAX_DECISIONS 100000

extern void batch_run(const DecisionRequest *requests, Decision *decisions, int count);

#endif							/* RL_BATCH_H */
