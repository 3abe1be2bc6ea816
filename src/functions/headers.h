/*
 * headers.h
 *	  A decision as HTTP: the RateLimit headers a client reads.
 */
#ifndef RL_HEADERS_H
#define RL_HEADERS_H

#include "lib/stringinfo.h"

#include "engine/decision.h"

/* The most fields one decision gets: legacy splits RateLimit into -Remaining and -Reset. */
#define HEADERS_MAX 4

typedef struct HeaderField
{
	const char *name;
	char	   *value;
} HeaderField;

/* The fields of one decision, in the order they are added. */
typedef struct HeaderSet
{
	int			count;
	HeaderField fields[HEADERS_MAX];
} HeaderSet;

extern void headers_build(Oid function_oid, const Decision *decision, bool legacy, HeaderSet *set);
extern void headers_append_json(StringInfo buf, const HeaderSet *set);

#endif							/* RL_HEADERS_H */
