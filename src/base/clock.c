/*
 * clock.c
 *	  Time as the extension sees it: the wall clock (or a test's), a monotonic
 *	  clock for deadlines, and ids nobody else makes.
 *
 * Buckets in Redis run on Redis's clock; ratelimit.test_clock_ms replaces it
 * (and this server's, for local buckets and overrides) with a fixed time, so
 * that a test decides at exactly the millisecond it says.
 */
#include "prelude.h"

#include "common/string.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/clock.h"

static char *test_clock_ms = NULL;

/* The test clock is empty (the real clock) or milliseconds since the epoch. */
static bool
check_test_clock(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;

	if (p == NULL || *p == '\0')
		return true;
	if (strlen(p) > 15 || strspn(p, "0123456789") != strlen(p))
	{
		GUC_check_errdetail("Give milliseconds since the epoch (at most 15 digits), or an empty string for Redis TIME.");
		return false;
	}
	return true;
}

/* Defines ratelimit.test_clock_ms; called once per process from _PG_init. */
void
clock_init(void)
{
	DefineCustomStringVariable("ratelimit.test_clock_ms",
							   "For tests: the time buckets see, in ms since the epoch; empty means Redis TIME.",
							   NULL, &test_clock_ms, "", PGC_SUSET,
							   GUC_NOT_IN_SAMPLE, check_test_clock, NULL, NULL);
}

/* The test clock's text ("" when unset), as the scripts take it. */
const char *
clock_test_ms(void)
{
	return test_clock_ms ? test_clock_ms : "";
}

/* Milliseconds since the Unix epoch of a timestamp. */
int64
clock_epoch_ms(TimestampTz timestamp)
{
	return timestamp / 1000 + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/* The timestamp of ms since the Unix epoch (clock_epoch_ms's inverse). */
TimestampTz
clock_timestamp_of_ms(int64 ms)
{
	return (ms - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000) * 1000;
}

/* Now in ms since the epoch: the test clock when set, else this server's clock. */
int64
clock_now_ms(void)
{
	if (test_clock_ms != NULL && test_clock_ms[0] != '\0')
		return strtoi64(test_clock_ms, NULL, 10);
	return clock_epoch_ms(GetCurrentTimestamp());
}

/*
 * A palloc'd id no other backend, here or on another server sharing the Redis,
 * will make: pid, start time, a random per-backend nonce, a counter.
 */
char *
clock_unique_id(void)
{
	static uint64 nonce = 0;
	static uint64 counter = 0;

	if (nonce == 0 && (!pg_strong_random(&nonce, sizeof(nonce)) || nonce == 0))
		nonce = (uint64) MyStartTimestamp ^ ((uint64) MyProcPid << 32) ^ 1;
	return psprintf("%d.%llx.%llu", MyProcPid, (unsigned long long) nonce,
					(unsigned long long) ++counter);
}
