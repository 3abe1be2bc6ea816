/*
 * denial.h
 *	  What the deny cache answers for a take, and what it learns.
 */
#ifndef RL_DENIAL_H
#define RL_DENIAL_H

#include "engine/decision.h"

extern bool denial_answer(const DecisionRequest *request, const LocalKey *key, int64 now_ms,
						  Decision *decision);
extern void denial_forget(const DecisionRequest *request, const LocalKey *key);
extern void denial_learn(const DecisionRequest *request, const LocalKey *key,
						 const Decision *decision, int64 asked_us);

#endif							/* RL_DENIAL_H */
