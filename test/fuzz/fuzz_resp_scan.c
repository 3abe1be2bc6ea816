/*
 * fuzz_resp_scan.c
 *	  Fuzz target: resp_scan fed a reply whole and in pieces must say the same,
 *	  and the readers (resp_read, resp_iterate, resp_next, resp_is) must walk
 *	  every value of a complete reply without a byte outside it.
 *
 * The input is a control byte, the cuts it asks for, then the bytes from
 * Redis. The low three bits of the control byte are how many cut bytes
 * follow (each a position in the bytes, as a fraction of 256); bit 3 asks
 * for the bytes one at a time too. Every scan gets an exact-size heap copy
 * of what has arrived, moved each time as exchange.c's buffer may be, so that
 * AddressSanitizer sees any read past it. Built with a small
 * RESP_MAX_REPLY_BYTES, so that its bounds are reached.
 */
#include "prelude.h"

#include "redis/resp.h"

#include "shim.h"

/* How many cut bytes the control byte may ask for. */
#define CUTS_MAX 7

/* Scans data[0 .. length) from a fresh scanner, whole. */
static RespScan
scan_whole(const char *data, size_t length, size_t *reply_length)
{
	RespScanner scanner;
	char	   *copy = shim_copy((const uint8_t *) data, length);
	RespScan	result;

	resp_scanner_start(&scanner);
	result = resp_scan(&scanner, copy, length, reply_length);
	pfree(copy);
	return result;
}

/*
 * Scans data as if it arrived in pieces ending at cuts[] (ascending) and then
 * at length, resuming the scanner each time; stops at the first answer that
 * is not RESP_INCOMPLETE.
 */
static RespScan
scan_pieces(const char *data, size_t length, const size_t *cuts, int ncuts, size_t *reply_length)
{
	RespScanner scanner;
	RespScan	result = RESP_INCOMPLETE;

	resp_scanner_start(&scanner);
	for (int i = 0; i <= ncuts && result == RESP_INCOMPLETE; i++)
	{
		size_t		arrived = i < ncuts ? cuts[i] : length;
		char	   *copy = shim_copy((const uint8_t *) data, arrived);

		result = resp_scan(&scanner, copy, arrived, reply_length);
		FUZZ_CHECK(scanner.position <= arrived);
		FUZZ_CHECK(scanner.depth >= 0 && scanner.depth <= RESP_MAX_DEPTH);
		if (result == RESP_COMPLETE)
			FUZZ_CHECK(*reply_length <= arrived);
		pfree(copy);
	}
	return result;
}

/* Where touch reads bytes to, so that the reads are not optimised away. */
static volatile char touched;

/* Reads every byte of a string value: AddressSanitizer checks each is in the reply. */
static void
touch(const char *str, int length)
{
	for (int i = 0; i < length; i++)
		touched ^= str[i];
}

/*
 * Walks the value that starts at start (read into value), checking it lies
 * within [reply, end); returns where it ends.
 */
static const char *
walk(const char *reply, const char *end, const char *start, const RespValue *value, int depth)
{
	const char *line_end;

	FUZZ_CHECK(depth <= RESP_MAX_DEPTH);
	FUZZ_CHECK(start >= reply && start < end);
	FUZZ_CHECK(value->type == (RespType) start[0]);
	line_end = memchr(start, '\r', end - start);
	FUZZ_CHECK(line_end != NULL && line_end + 1 < end && line_end[1] == '\n');
	(void) resp_is(value, "OK");
	(void) resp_is(value, "master");
	switch (value->type)
	{
		case RESP_STATUS:
		case RESP_ERROR:
			FUZZ_CHECK(value->str == start + 1 && value->str + value->length == line_end);
			touch(value->str, value->length);
			return line_end + 2;
		case RESP_INTEGER:
			return line_end + 2;
		case RESP_BULK:
			if (value->null)
			{
				FUZZ_CHECK(value->length == 0);
				return line_end + 2;
			}
			FUZZ_CHECK(value->length >= 0 && value->str == line_end + 2);
			FUZZ_CHECK(value->str + value->length + 2 <= end);
			touch(value->str, value->length);
			FUZZ_CHECK(value->str[value->length] == '\r' && value->str[value->length + 1] == '\n');
			return value->str + value->length + 2;
		case RESP_ARRAY:
			{
				RespIterator iterator;
				RespValue	element;
				const char *next = value->elements;
				int			count = 0;

				FUZZ_CHECK(value->elements == line_end + 2);
				FUZZ_CHECK(!value->null || value->length == 0);
				resp_iterate(value, &iterator);
				for (;;)
				{
					/* The next element starts where the one before ended. */
					const char *element_start = iterator.left > 0 ? iterator.next : NULL;

					if (!resp_next(&iterator, &element))
						break;
					FUZZ_CHECK(element_start == next);
					next = walk(reply, end, element_start, &element, depth + 1);
					count++;
				}
				FUZZ_CHECK(count == value->length);
				FUZZ_CHECK(!resp_next(&iterator, &element));
				return next;
			}
	}
	shim_fail("resp_read gave an unknown type %d", (int) value->type);
}

/* Checks that a complete reply, alone in an exact-size buffer, reads back whole. */
static void
check_reply(const char *data, size_t reply_length)
{
	char	   *reply = shim_copy((const uint8_t *) data, reply_length);
	RespValue	value;

	resp_read(reply, &value);
	FUZZ_CHECK(walk(reply, reply + reply_length, reply, &value, 0) == reply + reply_length);
	pfree(reply);
}

/* Cut positions sorted, for scan_pieces. */
static int
compare_sizes(const void *a, const void *b)
{
	size_t		x = *(const size_t *) a;
	size_t		y = *(const size_t *) b;

	return (x > y) - (x < y);
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: the control byte, its cuts, the bytes from Redis. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	size_t		cuts[CUTS_MAX];
	int			ncuts;
	bool		one_at_a_time;
	const char *data;
	size_t		length;
	size_t		whole_length = 0;
	size_t		pieces_length = 0;
	RespScan	whole;
	RespScan	pieces;

	if (size < 1)
		return 0;
	ncuts = input[0] & 7;
	one_at_a_time = (input[0] & 8) != 0;
	if (size < 1 + (size_t) ncuts)
		return 0;
	data = (const char *) input + 1 + ncuts;
	length = size - 1 - ncuts;
	for (int i = 0; i < ncuts; i++)
		cuts[i] = length * input[1 + i] / 256;
	qsort(cuts, ncuts, sizeof(size_t), compare_sizes);

	shim_begin();
	PG_TRY();
	{
		whole = scan_whole(data, length, &whole_length);
		/* The bound holds, whatever the bytes say of themselves. */
		if (whole == RESP_COMPLETE)
			FUZZ_CHECK(whole_length > 0 && whole_length <= RESP_MAX_REPLY_BYTES);
		if (whole == RESP_INCOMPLETE)
			FUZZ_CHECK(length <= RESP_MAX_REPLY_BYTES);

		pieces = scan_pieces(data, length, cuts, ncuts, &pieces_length);
		FUZZ_CHECK(pieces == whole);
		FUZZ_CHECK(whole != RESP_COMPLETE || pieces_length == whole_length);
		if (one_at_a_time)
		{
			size_t	   *every = palloc(length * sizeof(size_t));

			for (size_t i = 0; i < length; i++)
				every[i] = i;
			pieces = scan_pieces(data, length, every, (int) length, &pieces_length);
			FUZZ_CHECK(pieces == whole);
			FUZZ_CHECK(whole != RESP_COMPLETE || pieces_length == whole_length);
		}

		if (whole == RESP_COMPLETE)
			check_reply(data, whole_length);
	}
	PG_CATCH();
	{
		/* An ERROR with an errcode ends the input, as it would end a statement. */
		shim_error_caught();
	}
	PG_END_TRY();
	shim_end();
	return 0;
}
