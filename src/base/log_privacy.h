/*
 * log_privacy.h
 *	  What the server log may see of us: never a subject, never a secret.
 */
#ifndef RL_LOG_PRIVACY_H
#define RL_LOG_PRIVACY_H

#include "fmgr.h"

extern void log_privacy_init(void);
extern Datum log_privacy_call(FunctionCallInfo fcinfo, PGFunction body);

/*
 * Defines the SQL-callable C function name, whose body follows. Any line
 * logged while it runs (its own errors, a cancel or statement timeout, an
 * error PostgreSQL raises for it) leaves out the statement and its context,
 * either of which may hold a subject.
 */
#define RL_SQL_FUNCTION(name) \
	static Datum name##_body(PG_FUNCTION_ARGS); \
	PG_FUNCTION_INFO_V1(name); \
	Datum \
	name(PG_FUNCTION_ARGS) \
	{ \
		return log_privacy_call(fcinfo, name##_body); \
	} \
	static Datum \
	name##_body(PG_FUNCTION_ARGS)

#endif							/* RL_LOG_PRIVACY_H */
