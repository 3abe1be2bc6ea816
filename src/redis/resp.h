/*
 * resp.h
 *	  The Redis protocol (RESP2): commands written, replies read within fixed bounds.
 */
#ifndef RL_RESP_H
#define RL_RESP_H

#include "lib/stringinfo.h"

/*
 * The most bytes one reply may take. A reply that says it is longer (an array
 * of two billion elements, a bulk string of a gigabyte) is refused as soon as
 * its header is read, before anything is allocated for it. The fuzz build of
 * resp.c sets a smaller bound, so that replies at and past it are short.
 */
#ifndef RESP_MAX_REPLY_BYTES
#define RESP_MAX_REPLY_BYTES (1024 * 1024)
#endif
/* The deepest nesting of arrays a reply may have (ours need three). */
#define RESP_MAX_DEPTH 8

typedef enum RespType
{
	RESP_STATUS = '+',
	RESP_ERROR = '-',
	RESP_INTEGER = ':',
	RESP_BULK = '$',
	RESP_ARRAY = '*'
} RespType;

/* One value of a scanned reply; strings point into the reply's bytes. */
typedef struct RespValue
{
	RespType	type;
	bool		null;			/* $-1 or *-1 */
	int64		integer;		/* RESP_INTEGER */
	const char *str;			/* status, error, bulk: not NUL-terminated */
	int			length;			/* its length; for an array, its number of elements */
	const char *elements;		/* array: where its first element starts */
} RespValue;

/* What resp_scan found at the front of a buffer. */
typedef enum RespScan
{
	RESP_INCOMPLETE,			/* a valid start: more bytes are needed */
	RESP_COMPLETE,				/* one whole, valid reply */
	RESP_MALFORMED,				/* not RESP2 */
	RESP_TOO_LARGE				/* over RESP_MAX_REPLY_BYTES or RESP_MAX_DEPTH */
} RespScan;

/*
 * Where a scan of one reply has got to, so that more bytes resume it instead
 * of scanning the reply again from its start.
 */
typedef struct RespScanner
{
	size_t		position;		/* bytes of the reply scanned: whole values up to here */
	int			depth;
	int64		pending[RESP_MAX_DEPTH + 1];	/* values still to come at each level */
} RespScanner;

/* The elements of an array, one after the other. */
typedef struct RespIterator
{
	const char *next;
	int			left;
} RespIterator;

extern void resp_append_command(StringInfo out, int argc, const char *const *argv);
extern void resp_scanner_start(RespScanner *scanner);
extern RespScan resp_scan(RespScanner *scanner, const char *data, size_t length,
						  size_t *reply_length);
extern void resp_read(const char *data, RespValue *value);
extern void resp_iterate(const RespValue *array, RespIterator *iterator);
extern bool resp_next(RespIterator *iterator, RespValue *value);
extern bool resp_is(const RespValue *value, const char *text);

#endif							/* RL_RESP_H */
