/*
 * enforce.h
 *	  A denial as an error: RL429 or RL503 (rl_enforce, rl_limit_trigger), or
 *	  the PGRST error PostgREST turns into an HTTP 429 or 503 response.
 */
#ifndef RL_ENFORCE_H
#define RL_ENFORCE_H

#include "engine/decision.h"

extern void enforce_init(void);
extern void enforce(Oid function_oid, const Decision *decision);

#endif							/* RL_ENFORCE_H */
