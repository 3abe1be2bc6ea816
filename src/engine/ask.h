/*
 * ask.h
 *	  What one decision asks Redis, and how the reply reads (ask.c).
 */
#ifndef RL_ASK_H
#define RL_ASK_H

#include "engine/decision.h"
#include "redis/pipeline.h"

extern const char *decision_key(const DecisionRequest *request);
extern void ask_call_of(const LimitCall *part, const int64 *extras, int nextras, int nresults,
						RedisCall *call);
extern void ask_call(const DecisionRequest *request, LimitMode mode, const char *key,
					 int64 at_ms, int64 slice_most, RedisCall *call);
extern void decision_redis_call(const DecisionRequest *request, RedisCall *call);
extern bool decision_from_reply(const long long *results, bool slice, Decision *decision,
								RedisFailure *failure);
extern bool ask_reply_extras(const DecisionRequest *request, const RedisCall *call,
							 Decision *decision, RedisFailure *failure);

#endif							/* RL_ASK_H */
