/*
 * window.h
 *	  The windows of the window algorithms: aligned to the epoch, or starting
 *	  at a calendar boundary in a time zone; and the Redis key of one window.
 */
#ifndef RL_WINDOW_H
#define RL_WINDOW_H

#include "algorithm/limit.h"

/* A window's key outlives its end by this much, for clocks a little apart. */
#define WINDOW_KEY_MARGIN_MS 1000

extern WindowCalendar window_calendar(int months, int days, int64 time_us);
extern void window_at(const LimitParams *params, int64 at_ms, LimitWindow *window);
extern const char *window_key(const char *key, char letter, int64 start_ms);
extern const char *window_number(int64 value);

#endif							/* RL_WINDOW_H */
