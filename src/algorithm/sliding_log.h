/*
 * sliding_log.h
 *	  The sliding log: exact "at most capacity in any window", one sorted set
 *	  of timestamps per subject. Its scripts are lua/sliding_log/.
 */
#ifndef RL_SLIDING_LOG_H
#define RL_SLIDING_LOG_H

#include "algorithm/limit.h"

/* The log keeps one entry per token: capacity is bounded (the table says the same). */
#define SLIDING_LOG_MAX_CAPACITY 10000

extern const LimitOps sliding_log_ops;

#endif							/* RL_SLIDING_LOG_H */
