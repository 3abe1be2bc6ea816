/*
 * prelude.h
 *	  What every source file includes first: PostgreSQL's headers, the version
 *	  guard, and the few names the whole extension shares.
 */
#ifndef RL_PRELUDE_H
#define RL_PRELUDE_H

#include "postgres.h"

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

#endif							/* RL_PRELUDE_H */
