/*
 * fuzz_connection.c
 *	  Fuzz target: connection_open, with servers that answer whatever the
 *	  fuzzer says, through the static handshake_reply reading the replies to
 *	  AUTH, SELECT and ROLE (and for a Sentinel URL, the sentinels' answers
 *	  first), then one request on the connection opened, then opening it
 *	  again (the connection kept). A connection that opens names its node; one
 *	  that does not says why.
 *
 * Fuzzed through the public function rather than handshake_reply alone:
 * stream.c is the only thing faked (fake_stream.c), so the replies take the
 * path they take in a server. The input is a byte choosing the URL (which
 * decides what the handshake sends), a byte saying how bytes arrive (as for
 * fuzz_sentinel), then what the servers send, in order.
 */
#include "prelude.h"

#include "base/clock.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/url.h"

#include "fake_stream.h"
#include "shim.h"

static const char *const urls[] = {
	"redis://127.0.0.1:6379",
	"redis://app:s3cret@127.0.0.1:6379/2",
	"redis://:s3cret@10.0.0.1:6379,10.0.0.2:6379",
	"redis-sentinel://:s3cret@s1:26379,s2:26380/mymaster?db=1",
	"unix://:pw@/run/redis/redis.sock?db=4",
};

int			deadline_connect_timeout_ms = 1000;
int			deadline_command_timeout_ms = 1000;

/* Reads the reply to the request: any reply will do, it only has to be read. */
static void
request_reply(int index, const RespValue *reply, void *arg)
{
	*(RespType *) arg = reply->type;
}

/* Opens node 0's connection; checks it names its node, or says why it could not open. */
static bool
open_node(void)
{
	RedisFailure failure;
	bool		opened = false;
	bool		ok;

	memset(&failure, 0, sizeof(failure));
	ok = connection_open(0, 0, &opened, &failure);
	FUZZ_CHECK(ok == (connection_node(0)[0] != '\0'));
	if (!ok)
	{
		FUZZ_CHECK(failure.kind != REDIS_FAILURE_NONE);
		FUZZ_CHECK(memchr(failure.detail, '\0', sizeof(failure.detail)) != NULL);
	}
	return ok;
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: a URL, how bytes arrive, what the servers answer. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static bool defined = false;

	if (size < 2)
		return 0;
	if (!defined)
	{
		redis_url_init();
		connection_init();
		defined = true;
	}
	shim_begin();
	PG_TRY();
	{
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", ""));
		cluster_prepare();
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", urls[input[0] % lengthof(urls)]));
		cluster_prepare();
		fake_stream_start(input + 2, size - 2, (input[1] & 0x7f) == 0x7f ? 16384 : (input[1] & 0x7f) + 1,
						  (input[1] & 0x80) != 0);

		if (open_node())
		{
			const char *argv[1] = {"PING"};
			RedisFailure failure = {0};
			RespType	type;

			connection_begin(0);
			resp_append_command(connection_output(), 1, argv);
			if (connection_exchange(0, 1, clock_monotonic_us() + 1000 * 1000, 0, request_reply, &type,
									&failure))
				connection_done(0);
			else
				FUZZ_CHECK(failure.kind != REDIS_FAILURE_NONE && connection_node(0)[0] == '\0');
			(void) open_node();
		}
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
