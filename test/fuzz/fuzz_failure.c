/*
 * fuzz_failure.c
 *	  Fuzz target: redis_fail_with_error on any error text from Redis reads
 *	  only its bytes, and gives a failure of a class that error replies have,
 *	  with a NUL-terminated detail: the error's first word (for a permission
 *	  refusal, the command refused; for a script that failed, its message).
 *
 * The input is the text of an error reply (after its "-"), in an exact-size
 * heap copy, as it lies in the reply buffer.
 */
#include "prelude.h"

#include "redis/failure.h"

#include "shim.h"

/* True for the kinds an error reply can give. */
static bool
kind_of_error_reply(RedisFailureKind kind)
{
	switch (kind)
	{
		case REDIS_FAILURE_REPLY:
		case REDIS_FAILURE_PERMISSION:
		case REDIS_FAILURE_READONLY:
		case REDIS_FAILURE_LOADING:
		case REDIS_FAILURE_MASTERDOWN:
		case REDIS_FAILURE_CLUSTERDOWN:
		case REDIS_FAILURE_TRYAGAIN:
		case REDIS_FAILURE_BUSY:
		case REDIS_FAILURE_OOM:
		case REDIS_FAILURE_NOSCRIPT:
		case REDIS_FAILURE_AUTH:
		case REDIS_FAILURE_SCRIPT:
			return true;
		default:
			return false;
	}
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: the text of an error reply. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	RedisFailure failure;
	RedisFailure again;
	char	   *text;
	size_t		word = 0;

	shim_begin();
	PG_TRY();
	{
		text = shim_copy(input, size);
		memset(&failure, 0x7f, sizeof(failure));
		redis_fail_with_error(&failure, text, (int) size);
		FUZZ_CHECK(kind_of_error_reply(failure.kind));
		FUZZ_CHECK(strcmp(redis_failure_kind_name(failure.kind), "unknown") != 0);
		FUZZ_CHECK(memchr(failure.detail, '\0', sizeof(failure.detail)) != NULL);
		while (word < size && text[word] != ' ')
			word++;
		if (failure.kind == REDIS_FAILURE_SCRIPT)
		{
			/* The script's message after "ERR ", never longer than the text. */
			size_t		length = strlen(failure.detail);

			FUZZ_CHECK(size >= 4 && length <= size - 4 && memcmp(failure.detail, text + 4, length) == 0);
		}
		else if (failure.kind != REDIS_FAILURE_PERMISSION)
		{
			/* The first word, cut to fit. */
			size_t		length = Min(word, sizeof(failure.detail) - 1);

			FUZZ_CHECK(memcmp(failure.detail, text, length) == 0 && failure.detail[length] == '\0');
		}

		/* The same text, the same failure. */
		memset(&again, 0, sizeof(again));
		redis_fail_with_error(&again, text, (int) size);
		FUZZ_CHECK(again.kind == failure.kind && strcmp(again.detail, failure.detail) == 0);
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
