/*
 * booking.h
 *	  A wait booked in Redis (rl_consume's max_wait), slept through here.
 */
#ifndef RL_BOOKING_H
#define RL_BOOKING_H

#include "engine/decision.h"
#include "redis/pipeline.h"

/* A grant booked ahead of now, and the call that gives it back. */
typedef struct Booking
{
	Decision   *decision;		/* allowed, wait_ms ahead */
	RedisCall	give_back;		/* its cost back to its bucket, its request id forgotten */
} Booking;

extern bool booking_wait_ending(void);
extern void booking_run_despite_interrupts(RedisCall *calls, int count);
extern void booking_await(Booking *bookings, int count);

#endif							/* RL_BOOKING_H */
