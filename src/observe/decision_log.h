/*
 * decision_log.h
 *	  The decision log: a line per chosen decision, with a hash for the subject.
 */
#ifndef RL_DECISION_LOG_H
#define RL_DECISION_LOG_H

#include "engine/decision.h"

extern void decision_log_init(void);
extern void decision_log(const Decision *decision, int64 cost, const char *subject, int length);

#endif							/* RL_DECISION_LOG_H */
