/*
 * fixed_window.h
 *	  At most `capacity` per window: one integer per subject and window.
 *	  Its scripts are lua/fixed_window/.
 */
#ifndef RL_FIXED_WINDOW_H
#define RL_FIXED_WINDOW_H

#include "algorithm/limit.h"

extern const LimitOps fixed_window_ops;

#endif							/* RL_FIXED_WINDOW_H */
