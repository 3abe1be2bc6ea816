/*
 * resp.c
 *	  The Redis protocol (RESP2): commands written, replies read within fixed bounds.
 *
 * A reply is never turned into a tree of allocated objects: resp_scan checks
 * that the bytes at the front of a buffer are one whole, valid reply no larger
 * than RESP_MAX_REPLY_BYTES, and readers then walk those bytes in place. So a
 * hostile or broken server can make a backend hold at most the bounded buffer
 * (in a PostgreSQL memory context), whatever counts its headers claim. A scan
 * resumes where the last one stopped as more bytes arrive, so a reply costs
 * time in proportion to its bytes, never to a claimed count.
 */
#include "prelude.h"

#include "redis/resp.h"

/* The fewest bytes one element can take ("+\r\n"): bounds a claimed element count. */
#define RESP_MIN_ELEMENT_BYTES 3

/*
 * Appends a header line: prefix, value in decimal, CRLF ("*3\r\n", "$40\r\n").
 * Written by hand, not through a format: a rollback's refunds write a few
 * hundred thousand of them before the first byte goes out.
 */
static void
append_header(StringInfo out, char prefix, uint64 value)
{
	char		line[24];
	int			start = sizeof(line);

	line[--start] = '\n';
	line[--start] = '\r';
	do
	{
		line[--start] = '0' + value % 10;
		value /= 10;
	} while (value > 0);
	line[--start] = prefix;
	appendBinaryStringInfo(out, line + start, sizeof(line) - start);
}

/* Appends a command as an array of bulk strings: binary-safe, never a format string. */
void
resp_append_command(StringInfo out, int argc, const char *const *argv)
{
	append_header(out, '*', (uint64) argc);
	for (int i = 0; i < argc; i++)
	{
		size_t		length = strlen(argv[i]);

		append_header(out, '$', (uint64) length);
		appendBinaryStringInfo(out, argv[i], (int) length);
		appendBinaryStringInfo(out, "\r\n", 2);
	}
}

/*
 * Parses the header number between start and end (a '\r'): an optional '-' and
 * at most 18 digits. False when it is not one.
 */
static bool
parse_number(const char *start, const char *end, int64 *out)
{
	bool		negative = start < end && *start == '-';
	const char *p = start + negative;
	int64		value = 0;

	if (p == end || end - p > 18)
		return false;
	for (; p < end; p++)
	{
		if (*p < '0' || *p > '9')
			return false;
		value = value * 10 + (*p - '0');
	}
	*out = negative ? -value : value;
	return true;
}

/* Starts the scan of a new reply. */
void
resp_scanner_start(RespScanner *scanner)
{
	scanner->position = 0;
	scanner->depth = 0;
	scanner->pending[0] = 1;
}

/*
 * Checks that data[0 .. length) starts with one whole, valid reply; on
 * RESP_COMPLETE, *reply_length is its length (the buffer may hold more replies
 * after it). The scan resumes where scanner left it: data must start with the
 * same reply, with more bytes after those scanned already. Allocates nothing.
 */
RespScan
resp_scan(RespScanner *scanner, const char *data, size_t length, size_t *reply_length)
{
	const char *end = data + length;
	const char *p = data + scanner->position;

	for (;;)
	{
		const char *cr;
		const char *line;
		const char *next;
		char		type;
		int64		number = 0;

		if (p - data > RESP_MAX_REPLY_BYTES)
			return RESP_TOO_LARGE;
		if (p >= end)
			return RESP_INCOMPLETE;
		type = *p;
		line = p + 1;
		cr = memchr(line, '\r', end - line);
		if (cr == NULL || cr + 1 >= end)
			return end - data > RESP_MAX_REPLY_BYTES ? RESP_TOO_LARGE : RESP_INCOMPLETE;
		/*
		 * A line that ends past the bound is too large whatever it holds, as
		 * it is when its bytes come in pieces and the bound is passed first.
		 */
		if (cr + 2 - data > RESP_MAX_REPLY_BYTES)
			return RESP_TOO_LARGE;
		/*
		 * A header line is text ending at its first CR, which a LF follows: a
		 * NUL or LF in it is not RESP. The readers below rely on that.
		 */
		if (cr[1] != '\n' || memchr(line, '\0', cr - line) != NULL ||
			memchr(line, '\n', cr - line) != NULL)
			return RESP_MALFORMED;
		next = cr + 2;
		switch (type)
		{
			case RESP_STATUS:
			case RESP_ERROR:
				break;
			case RESP_INTEGER:
				if (!parse_number(line, cr, &number))
					return RESP_MALFORMED;
				break;
			case RESP_BULK:
				if (!parse_number(line, cr, &number) || number < -1)
					return RESP_MALFORMED;
				if (number < 0)
					break;
				/* Refused before its bytes (and CRLF) are awaited, let alone kept. */
				if (number + 2 > RESP_MAX_REPLY_BYTES - (next - data))
					return RESP_TOO_LARGE;
				if (end - next < number + 2)
					return RESP_INCOMPLETE;
				if (next[number] != '\r' || next[number + 1] != '\n')
					return RESP_MALFORMED;
				next += number + 2;
				break;
			case RESP_ARRAY:
				if (!parse_number(line, cr, &number) || number < -1)
					return RESP_MALFORMED;
				if (number <= 0)
					break;
				if (number > (RESP_MAX_REPLY_BYTES - (next - data)) / RESP_MIN_ELEMENT_BYTES ||
					scanner->depth == RESP_MAX_DEPTH)
					return RESP_TOO_LARGE;
				/* Its elements come next, one level down. */
				scanner->pending[++scanner->depth] = number;
				p = next;
				scanner->position = p - data;
				continue;
			default:
				return RESP_MALFORMED;
		}
		/* One value is done: so, maybe, are the arrays that end with it. */
		p = next;
		scanner->position = p - data;
		scanner->pending[scanner->depth]--;
		while (scanner->depth > 0 && scanner->pending[scanner->depth] == 0)
			scanner->pending[--scanner->depth]--;
		if (scanner->depth == 0 && scanner->pending[0] == 0)
		{
			*reply_length = p - data;
			return RESP_COMPLETE;
		}
	}
}

/*
 * Reads the value that starts at data, inside a reply resp_scan accepted: its
 * header line has no NUL, and ends at its first CR.
 */
void
resp_read(const char *data, RespValue *value)
{
	const char *line = data + 1;
	const char *cr = strchr(line, '\r');
	int64		number = 0;

	memset(value, 0, sizeof(*value));
	value->type = (RespType) data[0];
	switch (value->type)
	{
		case RESP_STATUS:
		case RESP_ERROR:
			value->str = line;
			value->length = cr - line;
			break;
		case RESP_INTEGER:
			(void) parse_number(line, cr, &value->integer);
			break;
		case RESP_BULK:
			(void) parse_number(line, cr, &number);
			value->null = number < 0;
			value->str = cr + 2;
			value->length = number < 0 ? 0 : (int) number;
			break;
		case RESP_ARRAY:
			(void) parse_number(line, cr, &number);
			value->null = number < 0;
			value->length = number < 0 ? 0 : (int) number;
			value->elements = cr + 2;
			break;
	}
}

/* Where the value that starts at data ends (inside a reply resp_scan accepted). */
static const char *
resp_skip(const char *data)
{
	RespValue	value;
	const char *p;

	resp_read(data, &value);
	switch (value.type)
	{
		case RESP_BULK:
			return value.null ? strchr(data, '\r') + 2 : value.str + value.length + 2;
		case RESP_ARRAY:
			p = value.elements;
			for (int i = 0; i < value.length; i++)
				p = resp_skip(p);
			return p;
		default:
			return strchr(data, '\r') + 2;
	}
}

/* Starts walking the elements of array. */
void
resp_iterate(const RespValue *array, RespIterator *iterator)
{
	Assert(array->type == RESP_ARRAY);
	iterator->next = array->elements;
	iterator->left = array->length;
}

/* Reads the next element into value; false when there is none. */
bool
resp_next(RespIterator *iterator, RespValue *value)
{
	if (iterator->left <= 0)
		return false;
	resp_read(iterator->next, value);
	iterator->left--;
	if (iterator->left > 0)
		iterator->next = resp_skip(iterator->next);
	return true;
}

/* True when value is a status or bulk string equal to text, ignoring case. */
bool
resp_is(const RespValue *value, const char *text)
{
	return (value->type == RESP_STATUS || value->type == RESP_BULK) && !value->null &&
		value->length == (int) strlen(text) && pg_strncasecmp(value->str, text, value->length) == 0;
}
