/*
 * headers.h
 *	  A decision as HTTP: RateLimit headers, and the error PostgREST turns into a response.
 */
#ifndef RL_HEADERS_H
#define RL_HEADERS_H

#include "decision.h"

/*
 * For ratelimit.postgrest_errors: raises a denial as SQLSTATE PGRST, whose JSON
 * message and detail PostgREST answers with a 429 (or a 503 for fail_closed)
 * and the decision's RateLimit headers.
 */
extern void headers_raise_postgrest(Oid function_oid, const Decision *decision) pg_attribute_noreturn();

#endif							/* RL_HEADERS_H */
