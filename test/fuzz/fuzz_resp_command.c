/*
 * fuzz_resp_command.c
 *	  Fuzz target: what resp_append_command writes scans back as an array of
 *	  the same bulk strings, also with another command after it in the buffer.
 *
 * The input is the arguments, separated by NUL bytes (an empty input: no
 * argument). The first command is every argument; the second, after it in the
 * same buffer as in a pipeline, is the arguments in reverse order.
 */
#include "prelude.h"

#include "redis/resp.h"

#include "shim.h"

/* The most arguments one input is cut into. */
#define ARGUMENTS_MAX 256

/* Checks that data[0 .. length) starts with one reply, argv as bulk strings; returns its length. */
static size_t
check_command(const char *data, size_t length, int argc, const char *const *argv)
{
	RespScanner scanner;
	size_t		reply_length = 0;
	char	   *reply;
	RespValue	array;
	RespValue	element;
	RespIterator iterator;
	int			n = 0;

	resp_scanner_start(&scanner);
	FUZZ_CHECK(resp_scan(&scanner, data, length, &reply_length) == RESP_COMPLETE);
	reply = shim_copy((const uint8_t *) data, reply_length);
	resp_read(reply, &array);
	FUZZ_CHECK(array.type == RESP_ARRAY && !array.null && array.length == argc);
	resp_iterate(&array, &iterator);
	while (resp_next(&iterator, &element))
	{
		FUZZ_CHECK(n < argc);
		FUZZ_CHECK(element.type == RESP_BULK && !element.null);
		FUZZ_CHECK(element.length == (int) strlen(argv[n]));
		FUZZ_CHECK(memcmp(element.str, argv[n], element.length) == 0);
		n++;
	}
	FUZZ_CHECK(n == argc);
	pfree(reply);
	return reply_length;
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: the arguments of a command, separated by NULs. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	const char *argv[ARGUMENTS_MAX];
	const char *reversed[ARGUMENTS_MAX];
	char	   *text;
	int			argc = 0;
	StringInfoData out;
	size_t		first;

	shim_begin();
	PG_TRY();
	{
		/* A NUL-terminated copy: each NUL in it ends one argument. */
		text = palloc(size + 1);
		memcpy(text, input, size);
		text[size] = '\0';
		for (const char *p = text; size > 0 && argc < ARGUMENTS_MAX; p += strlen(p) + 1)
		{
			argv[argc++] = p;
			if (p + strlen(p) == text + size)
				break;
		}
		for (int i = 0; i < argc; i++)
			reversed[i] = argv[argc - 1 - i];

		initStringInfo(&out);
		resp_append_command(&out, argc, argv);
		resp_append_command(&out, argc, reversed);
		first = check_command(out.data, out.len, argc, argv);
		FUZZ_CHECK(check_command(out.data + first, out.len - first, argc, reversed) == out.len - first);
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
