/*
 * ratelimit.h
 *	  The prelude every source file includes: PostgreSQL headers, version guards
 *	  and the settings (GUCs) defined in ratelimit.c.
 */
#ifndef RATELIMIT_H
#define RATELIMIT_H

#include "postgres.h"

#if PG_VERSION_NUM < 150000
#error "ratelimit needs PostgreSQL 15 or newer"
#endif

/* Our own SQLSTATE for a denied rl_enforce: class "RL" is not one of PostgreSQL's. */
#define ERRCODE_RL_RATE_LIMIT_EXCEEDED MAKE_SQLSTATE('R', 'L', '4', '2', '9')

/* The longest subject accepted, in bytes; longer ones are an error, not truncated. */
#define RL_SUBJECT_MAX_BYTES 1024

/* Settings: see _PG_init in ratelimit.c for their meaning and defaults. */
extern char *rl_redis_url;
extern int	rl_connect_timeout_ms;
extern int	rl_command_timeout_ms;
extern char *rl_key_prefix;
extern char *rl_key_scope;
extern char *rl_subject_secret;
extern char *rl_test_clock_ms;

#endif							/* RATELIMIT_H */
