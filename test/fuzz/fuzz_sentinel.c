/*
 * fuzz_sentinel.c
 *	  Fuzz target: sentinel_find_master, with sentinels that answer whatever
 *	  the fuzzer says, through the real exchange.c (reply buffers, scans
 *	  resumed as bytes arrive) and the static found_master reading each reply.
 *	  A master found has a host (not empty) and a port in range; a search
 *	  that finds none says why. What the backend sends is well-formed commands.
 *
 * Fuzzed through the public function rather than found_master alone: stream.c
 * is the only thing faked (fake_stream.c), so the replies take the path they
 * take in a server. The input is a byte choosing the URL, a byte saying how
 * bytes arrive (its low seven bits: how many per read, 127 for 16384; its
 * high bit: the sentinel closes the connection once it has said everything,
 * else it goes silent until the deadline), then what the sentinels send, to
 * one connection after the other. Each input asks twice, the second time on
 * the connection kept from the first when it is.
 */
#include "prelude.h"

#include "redis/sentinel.h"
#include "redis/url.h"

#include "fake_stream.h"
#include "shim.h"

static const char *const urls[] = {
	"redis-sentinel://127.0.0.1:26379/mymaster",
	"redis-sentinel://s1:26379,s2:26380,[::1]:26381/mymaster?sentinel_user=watcher",
	"rediss-sentinel://s1,s2/cache-7?db=3",
};

/* Asks for the master, and checks what comes back. */
static void
find_master(const RedisUrl *url)
{
	RedisHostPort master = {0};
	RedisFailure failure;

	memset(&failure, 0, sizeof(failure));
	if (sentinel_find_master(url, 1000, 0, &master, &failure))
	{
		FUZZ_CHECK(master.host != NULL && master.host[0] != '\0' && strlen(master.host) < 256);
		FUZZ_CHECK(master.port >= 1 && master.port <= 65535);
	}
	else
	{
		FUZZ_CHECK(failure.kind != REDIS_FAILURE_NONE);
		FUZZ_CHECK(memchr(failure.detail, '\0', sizeof(failure.detail)) != NULL);
	}
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: a URL, how bytes arrive, what the sentinels answer. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static bool defined = false;
	RedisUrl	url;
	const char *problem;
	const char *text;

	if (size < 2)
		return 0;
	if (!defined)
	{
		redis_url_init();
		defined = true;
	}
	shim_begin();
	PG_TRY();
	{
		text = urls[input[0] % lengthof(urls)];
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", text));
		FUZZ_CHECK(redis_url_parse(text, &url, &problem));
		fake_stream_start(input + 2, size - 2, (input[1] & 0x7f) == 0x7f ? 16384 : (input[1] & 0x7f) + 1,
						  (input[1] & 0x80) != 0);

		find_master(&url);
		find_master(&url);
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
