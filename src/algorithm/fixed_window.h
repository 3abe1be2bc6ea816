/*
 * fixed_window.h
 *	  At most `capacity` per window (with rollover, and what the window
 *	  before left unused): one value per subject and window.
 *	  Its scripts are lua/fixed_window/.
 */
#ifndef RL_FIXED_WINDOW_H
#define RL_FIXED_WINDOW_H

#include "algorithm/limit.h"

/* The group script's tag of a fixed window with rollover (lua/group.lua: its ROLLOVER cell). */
#define FIXED_WINDOW_ROLLOVER_TAG 6

extern const LimitOps fixed_window_ops;
extern bool fixed_window_answers_limit(const LimitParams *params, LimitMode mode);

#endif							/* RL_FIXED_WINDOW_H */
