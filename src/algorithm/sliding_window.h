/*
 * sliding_window.h
 *	  The sliding window counter: this window's count plus the previous
 *	  window's, weighted by how much of it the sliding window still covers.
 *	  Its scripts are lua/sliding_window/.
 */
#ifndef RL_SLIDING_WINDOW_H
#define RL_SLIDING_WINDOW_H

#include "algorithm/limit.h"

extern const LimitOps sliding_window_ops;

#endif							/* RL_SLIDING_WINDOW_H */
