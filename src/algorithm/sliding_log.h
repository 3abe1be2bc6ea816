/*
 * sliding_log.h
 *	  The sliding log: exact "at most capacity in any window", one sorted set
 *	  per subject with a member per granted request. Its scripts are
 *	  lua/sliding_log/.
 */
#ifndef RL_SLIDING_LOG_H
#define RL_SLIDING_LOG_H

#include "algorithm/limit.h"

/*
 * A log holds up to a member per token in its window (requests of cost 1), and
 * its scripts are measured at this bound (test/t/013): capacity is bounded
 * (the table says the same).
 */
#define SLIDING_LOG_MAX_CAPACITY 10000

extern const LimitOps sliding_log_ops;

#endif							/* RL_SLIDING_LOG_H */
