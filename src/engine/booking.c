/*
 * booking.c
 *	  A wait booked in Redis, slept through here (rl_consume's max_wait).
 *
 * A take that may wait and does not fit now books, in the same script, the
 * earliest time its cost will fit, so that later callers queue behind it
 * (lua/cells.lua: book_one). The backend then sleeps until that time on its
 * latch, so that a cancel, a statement_timeout or a terminate ends the sleep
 * at once; the booking is given back then, before the error is raised, so the
 * next caller is served earlier and nothing booked is lost. The give-back is
 * made with interrupts held (it has its own deadline, as every call has):
 * the cancel that caused it must not cancel it too.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/wait_event.h"

#include "base/clock.h"
#include "engine/booking.h"

/*
 * True when an interrupt is pending that ends the statement or the session
 * (a cancel, statement_timeout, a terminate, a client gone; PostgreSQL 17's
 * transaction_timeout): the wait must end, and what it booked go back first.
 */
bool
booking_wait_ending(void)
{
	return InterruptPending &&
		(QueryCancelPending || ProcDiePending || ClientConnectionLost
#if PG_VERSION_NUM >= 170000
		 || TransactionTimeoutPending
#endif
		);
}

/* Puts back the cancel and terminate set aside (and any that came since), and resumes interrupts. */
static void
restore_interrupts(bool cancel, bool die)
{
	QueryCancelPending = QueryCancelPending || cancel;
	ProcDiePending = ProcDiePending || die;
	InterruptPending = true;
	RESUME_INTERRUPTS();
}

/*
 * Runs calls although an interrupt that ends the statement may be pending (a
 * give-back because of it): the cancel (or terminate) is set aside while they
 * run, since with interrupts held one pending would end their wait at once
 * (redis/socket.c). One that comes meanwhile still ends it; both are served
 * when interrupts resume, whatever the calls raised. Each call keeps its own
 * deadline.
 */
void
booking_run_despite_interrupts(RedisCall *calls, int count)
{
	RedisFailure failure;
	bool		cancel = QueryCancelPending;
	bool		die = ProcDiePending;

	HOLD_INTERRUPTS();
	QueryCancelPending = false;
	ProcDiePending = false;
	PG_TRY();
	{
		(void) redis_run_scripts(calls, count, 0, &failure);
	}
	PG_CATCH();
	{
		restore_interrupts(cancel, die);
		PG_RE_THROW();
	}
	PG_END_TRY();
	restore_interrupts(cancel, die);
}

/*
 * Gives back every booking that has a give-back (a replay booked nothing): in
 * one round trip per node, each once (its call has a mark); what Redis does not
 * answer stays booked, which can only delay later callers, never grant more.
 * Each decision becomes a denial: its wait did not end.
 */
static void
give_back(Booking *bookings, int count, int64 left_ms)
{
	RedisCall  *calls = palloc(count * sizeof(RedisCall));
	int			ncalls = 0;

	for (int i = 0; i < count; i++)
	{
		if (bookings[i].give_back.script != NULL)
			calls[ncalls++] = bookings[i].give_back;
		bookings[i].decision->allowed = false;
		bookings[i].decision->retry_after_ms = Max(left_ms, 1);
		bookings[i].decision->wait_ms = 0;
	}

	if (ncalls > 0)
		booking_run_despite_interrupts(calls, ncalls);
	pfree(calls);
}

/*
 * Sleeps until every booking's time has come, then says in each decision how
 * long it waited. An interrupt that ends the statement or the session, during
 * the sleep, gives the bookings back and is then raised; one that is held off
 * (it raises nothing) leaves the decisions denied.
 */
void
booking_await(Booking *bookings, int count)
{
	int64		longest_us = 0;
	int64		start_us = clock_monotonic_us();
	int64		waited_us;

	for (int i = 0; i < count; i++)
		longest_us = Max(longest_us, bookings[i].decision->wait_ms * 1000);
	for (;;)
	{
		int64		left_us = longest_us - (clock_monotonic_us() - start_us);

		if (booking_wait_ending())
		{
			give_back(bookings, count, (Max(left_us, 0) + 999) / 1000);
			CHECK_FOR_INTERRUPTS();
			return;
		}
		if (left_us <= 0)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (left_us + 999) / 1000, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if (!booking_wait_ending())
			CHECK_FOR_INTERRUPTS();
	}
	waited_us = clock_monotonic_us() - start_us;
	for (int i = 0; i < count; i++)
		bookings[i].decision->waited_ms = waited_us / 1000;
}
