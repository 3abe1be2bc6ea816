/*
 * ratelimit.h
 *	  The prelude every source file includes: PostgreSQL headers, version guards
 *	  and the settings (GUCs) defined in ratelimit.c.
 */
#ifndef RATELIMIT_H
#define RATELIMIT_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "portability/instr_time.h"

#if PG_VERSION_NUM < 150000
#error "ratelimit needs PostgreSQL 15 or newer"
#endif

/*
 * Our own SQLSTATEs for a denied rl_enforce (class "RL" is not one of PostgreSQL's):
 * over quota (an API answers 429), or Redis unavailable under a closed fail mode (503).
 */
#define ERRCODE_RL_RATE_LIMIT_EXCEEDED MAKE_SQLSTATE('R', 'L', '4', '2', '9')
#define ERRCODE_RL_UNAVAILABLE MAKE_SQLSTATE('R', 'L', '5', '0', '3')

/* The longest subject accepted, in bytes; longer ones are an error, not truncated. */
#define RL_SUBJECT_MAX_BYTES 1024

/* Settings: see _PG_init in ratelimit.c for their meaning and defaults. */
extern char *rl_redis_url;
extern int	rl_connect_timeout_ms;
extern int	rl_command_timeout_ms;
extern int	rl_retry_interval_ms;
extern char *rl_key_prefix;
extern char *rl_key_scope;
extern char *rl_test_clock_ms;
extern int	rl_log_decisions;
extern double rl_log_sample_rate;
extern bool rl_postgrest_errors;
extern bool rl_track_stats;
extern int	rl_stats_policies;

/* ratelimit.log_decisions: which decisions get a log line. */
typedef enum LogDecisions
{
	LOG_DECISIONS_NONE,
	LOG_DECISIONS_DENIED,
	LOG_DECISIONS_ALL
} LogDecisions;

extern char *rl_unique_id(void);
extern int64 rl_epoch_ms(TimestampTz timestamp);
extern int64 rl_now_ms(void);

/* Microseconds on a monotonic clock: deadlines must not move when the wall clock does. */
static inline int64
rl_monotonic_us(void)
{
	instr_time	now;

	INSTR_TIME_SET_CURRENT(now);
	return (int64) INSTR_TIME_GET_MICROSEC(now);
}

#endif							/* RATELIMIT_H */
