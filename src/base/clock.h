/*
 * clock.h
 *	  Time as the extension sees it: the wall clock (or a test's), a monotonic
 *	  clock for deadlines, and ids nobody else makes.
 */
#ifndef RL_CLOCK_H
#define RL_CLOCK_H

#include "datatype/timestamp.h"
#include "portability/instr_time.h"

extern void clock_init(void);
extern int64 clock_epoch_ms(TimestampTz timestamp);
extern TimestampTz clock_timestamp_of_ms(int64 ms);
extern int64 clock_now_ms(void);
extern const char *clock_test_ms(void);
extern char *clock_unique_id(void);

/* Microseconds on a monotonic clock: deadlines must not move when the wall clock does. */
static inline int64
clock_monotonic_us(void)
{
	instr_time	now;

	INSTR_TIME_SET_CURRENT(now);
	return (int64) INSTR_TIME_GET_MICROSEC(now);
}

#endif							/* RL_CLOCK_H */
