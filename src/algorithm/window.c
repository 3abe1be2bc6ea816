/*
 * window.c
 *	  The windows of the window algorithms.
 *
 * A window of exactly one second, minute, hour, day, week, month or year
 * starts at that calendar boundary in the policy's time zone, as PostgreSQL's
 * date_trunc(unit, t, zone) says, and ends at the next one: a day in
 * Europe/Berlin lasts 23 or 25 hours at the DST changes. Any other length is
 * aligned to the epoch. PostgreSQL knows the zones, so the windows are
 * computed here, on this server's clock (or the test clock), and Redis is
 * told which window's key to count in and how long it has left.
 */
#include "prelude.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "algorithm/window.h"

/* The calendar windows last computed: a window is reused until now leaves it. */
#define WINDOW_CACHE 8

typedef struct CachedWindow
{
	WindowCalendar calendar;
	char		time_zone[LIMIT_ZONE_LEN];
	LimitWindow window;
} CachedWindow;

static CachedWindow cache[WINDOW_CACHE];
static int	cache_next = 0;

/* The calendar unit an interval is exactly one of, or CALENDAR_NONE. */
WindowCalendar
window_calendar(int months, int days, int64 time_us)
{
	if (months == 12 && days == 0 && time_us == 0)
		return CALENDAR_YEAR;
	if (months == 1 && days == 0 && time_us == 0)
		return CALENDAR_MONTH;
	if (months != 0)
		return CALENDAR_NONE;
	if (days == 7 && time_us == 0)
		return CALENDAR_WEEK;
	if (days == 1 && time_us == 0)
		return CALENDAR_DAY;
	if (days != 0)
		return CALENDAR_NONE;
	if (time_us == USECS_PER_HOUR)
		return CALENDAR_HOUR;
	if (time_us == USECS_PER_MINUTE)
		return CALENDAR_MINUTE;
	if (time_us == USECS_PER_SEC)
		return CALENDAR_SECOND;
	return CALENDAR_NONE;
}

/* date_trunc's name of a calendar unit, and one of it as an interval. */
static const char *
calendar_unit(WindowCalendar calendar, Interval *one)
{
	memset(one, 0, sizeof(*one));
	switch (calendar)
	{
		case CALENDAR_YEAR:
			one->month = 12;
			return "year";
		case CALENDAR_MONTH:
			one->month = 1;
			return "month";
		case CALENDAR_WEEK:
			one->day = 7;
			return "week";
		case CALENDAR_DAY:
			one->day = 1;
			return "day";
		case CALENDAR_HOUR:
			one->time = USECS_PER_HOUR;
			return "hour";
		case CALENDAR_MINUTE:
			one->time = USECS_PER_MINUTE;
			return "minute";
		case CALENDAR_SECOND:
		case CALENDAR_NONE:
			break;
	}
	one->time = USECS_PER_SEC;
	return "second";
}

/* ms since the Unix epoch as a timestamptz, and back. */
static TimestampTz
ms_timestamp(int64 ms)
{
	return (ms - (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000) * 1000;
}

static int64
timestamp_ms(TimestampTz timestamp)
{
	int64		us = timestamp + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * USECS_PER_SEC;

	/* Rounded down (floor), for times before the epoch too. */
	return us >= 0 ? us / 1000 : -((-us + 999) / 1000);
}

/* A calendar unit's nominal length: exact below a day; the fallback window's above. */
static int64
calendar_nominal_ms(WindowCalendar calendar)
{
	switch (calendar)
	{
		case CALENDAR_YEAR:
			return INT64CONST(365) * 86400000;
		case CALENDAR_MONTH:
			return INT64CONST(30) * 86400000;
		case CALENDAR_WEEK:
			return INT64CONST(7) * 86400000;
		case CALENDAR_DAY:
			return 86400000;
		case CALENDAR_HOUR:
			return 3600000;
		case CALENDAR_MINUTE:
			return 60000;
		case CALENDAR_SECOND:
		case CALENDAR_NONE:
			break;
	}
	return 1000;
}

/*
 * The calendar window around at_ms: date_trunc(unit, at, zone), as PostgreSQL
 * computes it, and its end: a second, minute or hour later in absolute time (a
 * local hour repeated when the clocks go back is two windows, not one of two
 * hours), the next local day, week, month or year boundary otherwise: the
 * local start plus one unit, truncated to the unit, for a day that began at
 * 01:00 because its midnight was skipped (Santiago, Beirut, Havana) still
 * ends at the next midnight, not at 01:00. Should
 * a zone's rules leave at_ms outside what that gives, the window is the
 * unit's nominal length aligned to the epoch: the same for every backend.
 */
static void
calendar_window(WindowCalendar calendar, const char *time_zone, int64 at_ms,
				LimitWindow *window)
{
	Interval	one;
	const char *unit = calendar_unit(calendar, &one);
	Datum		zone = CStringGetTextDatum(time_zone);
	Datum		start = DirectFunctionCall3(timestamptz_trunc_zone, CStringGetTextDatum(unit),
											TimestampTzGetDatum(ms_timestamp(at_ms)), zone);
	int64		nominal = calendar_nominal_ms(calendar);

	window->start_ms = timestamp_ms(DatumGetTimestampTz(start));
	if (calendar <= CALENDAR_HOUR)
		window->end_ms = window->start_ms + nominal;
	else
	{
		Datum		local = DirectFunctionCall2(timestamptz_zone, zone, start);
		Datum		next = DirectFunctionCall2(timestamp_trunc, CStringGetTextDatum(unit),
											   DirectFunctionCall2(timestamp_pl_interval, local,
																   IntervalPGetDatum(&one)));

		window->end_ms = timestamp_ms(DatumGetTimestampTz(DirectFunctionCall2(timestamp_zone,
																			  zone, next)));
	}
	if (!(window->start_ms <= at_ms && at_ms < window->end_ms))
	{
		window->start_ms = at_ms - at_ms % nominal;
		window->end_ms = window->start_ms + nominal;
	}
}

/* The window of params that at_ms falls in. */
void
window_at(const LimitParams *params, int64 at_ms, LimitWindow *window)
{
	if (params->calendar == CALENDAR_NONE)
	{
		Assert(params->window_ms > 0 && at_ms >= 0);
		window->start_ms = at_ms - at_ms % params->window_ms;
		window->end_ms = window->start_ms + params->window_ms;
		return;
	}
	for (int i = 0; i < WINDOW_CACHE; i++)
	{
		CachedWindow *cached = &cache[i];

		if (cached->calendar == params->calendar &&
			cached->window.start_ms <= at_ms && at_ms < cached->window.end_ms &&
			strcmp(cached->time_zone, params->time_zone) == 0)
		{
			*window = cached->window;
			return;
		}
	}
	calendar_window(params->calendar, params->time_zone, at_ms, window);
	cache[cache_next].calendar = params->calendar;
	strlcpy(cache[cache_next].time_zone, params->time_zone, LIMIT_ZONE_LEN);
	cache[cache_next].window = *window;
	cache_next = (cache_next + 1) % WINDOW_CACHE;
}

/* A number as the scripts take it, printed in the current memory context. */
const char *
window_number(int64 value)
{
	return psprintf(INT64_FORMAT, value);
}

/*
 * The key of one window of a subject: its key, ":" and letter ('w'; a fixed
 * window with rollover 'r', whose value holds what it carried) and the
 * window's start in base 36 (palloc'd). Each window counts in a key of its
 * own, so a window never inherits another's count, whatever the clocks say.
 */
const char *
window_key(const char *key, char letter, int64 start_ms)
{
	static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
	char		text[16];
	int			length = 0;
	uint64		value = (uint64) start_ms;

	do
	{
		text[length++] = digits[value % 36];
		value /= 36;
	} while (value > 0);
	{
		char	   *out = palloc(strlen(key) + 3 + length);
		char	   *p = out + strlen(key);

		memcpy(out, key, strlen(key));
		*p++ = ':';
		*p++ = letter;
		while (length > 0)
			*p++ = text[--length];
		*p = '\0';
		return out;
	}
}
