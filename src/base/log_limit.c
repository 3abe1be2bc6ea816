/*
 * log_limit.c
 *	  At most one failure line per class and interval in each backend.
 *
 * A Redis that fails every other call (out of memory for one script, not for
 * another; a flapping network) must not write a line per call. Each kind of
 * line names its class (the failure, the reason a refund was lost); a class
 * logs at most once per interval (the callers use ratelimit.retry_interval)
 * in a backend, and its next line says how many were held back meanwhile. A
 * few recent classes are kept; one that falls out of the table only logs
 * again sooner.
 */
#include "prelude.h"

#include "base/clock.h"
#include "base/log_limit.h"

#define LOG_LIMIT_CLASSES 16
#define LOG_LIMIT_CLASS_BYTES 128

typedef struct LogClass
{
	char		name[LOG_LIMIT_CLASS_BYTES];
	int64		logged_us;		/* when its last line was logged */
	int64		held_back;		/* lines not logged since */
	int64		used_us;		/* last asked about, to replace the stalest */
} LogClass;

static LogClass classes[LOG_LIMIT_CLASSES];

/*
 * True when a line of line_class may be logged now, none of that class having
 * been logged for interval_ms; then *held_back says how many lines of that
 * class were not logged since its last one.
 */
bool
log_limit_allow(const char *line_class, int64 interval_ms, int64 *held_back)
{
	int64		now = clock_monotonic_us();
	LogClass   *found = NULL;
	LogClass   *stalest = &classes[0];

	for (int i = 0; i < LOG_LIMIT_CLASSES; i++)
	{
		if (classes[i].name[0] != '\0' && strcmp(classes[i].name, line_class) == 0)
		{
			found = &classes[i];
			break;
		}
		if (classes[i].used_us < stalest->used_us)
			stalest = &classes[i];
	}
	if (found == NULL)
	{
		found = stalest;
		strlcpy(found->name, line_class, sizeof(found->name));
		found->held_back = 0;
		found->logged_us = 0;
	}
	found->used_us = now;
	if (found->logged_us != 0 && now - found->logged_us < interval_ms * 1000)
	{
		found->held_back++;
		return false;
	}
	*held_back = found->held_back;
	found->held_back = 0;
	found->logged_us = now;
	return true;
}
