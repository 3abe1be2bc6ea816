/*
 * fuzz_pipeline.c
 *	  Fuzz target: redis_run_scripts, with nodes that answer whatever the
 *	  fuzzer says, through the static call_reply that reads each reply
 *	  (a call's integers, NOSCRIPT, MOVED and ASK, the slot map) and the real
 *	  cluster.c. Every run ends; each call is answered or failed, with a
 *	  failure of a known kind; what goes out is one command per reply read.
 *
 * Fuzzed through the public function rather than call_reply alone: only the
 * layers below it are faked (connection.h, breaker.h: below), so the replies
 * take the path they take in a server. The input is a byte choosing the URL,
 * a byte for the calls (how many, which subjects and scripts), then a tape
 * that every node's turn reads from, in order: a byte for its breaker (bit 0:
 * open, the node is skipped; bit 1: probing), a byte before each opening
 * (bit 0: the connection cannot be opened; bit 2: it was open already), and
 * the replies, each a whole RESP reply (anything else: the connection
 * broke).
 */
#include "prelude.h"

#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/pipeline.h"
#include "redis/url.h"

#include "shim.h"

#define CALLS_MAX 4

static const char *const urls[] = {
	"redis://127.0.0.1:7000",
	"redis://10.0.0.1:7000,redis-2.example:7001,[::1]:7002",
	"unix:///run/redis/redis.sock",
};

/* Two scripts: a take, and a peek with its shebang and the same without it. */
static const LuaScript peek_plain = {
	"peek (plain)", "return {1}", "1111111111111111111111111111111111111111"
};
static const LuaScript scripts[] = {
	{"take", "return {1, 2, 3, 4}", "0000000000000000000000000000000000000000"},
	{"peek", "#!lua flags=no-writes\nreturn {1}", "2222222222222222222222222222222222222222",
	&peek_plain},
};

int			deadline_command_timeout_ms = 1000;

/* What the fake nodes answer, and the commands written for the exchange under way. */
static const uint8_t *tape;
static size_t tape_left;
static StringInfoData output;
static const LuaScript *sent[REDIS_MAX_NODES][8];

/* Takes the next byte of the tape (0 once it is spent). */
static uint8_t
tape_byte(void)
{
	if (tape_left == 0)
		return 0;
	tape_left--;
	return *tape++;
}

/* Opens a node's connection, or fails to, as the tape says. */
bool
connection_open(int node, int64 deadline, bool *opened, RedisFailure *failure)
{
	uint8_t		byte = tape_byte();

	FUZZ_CHECK(node >= 0 && node < cluster_node_count());
	if (byte & 1)
		return redis_fail(failure, REDIS_FAILURE_CONNECT, "refused");
	/* A connection kept from before, or a new one. */
	*opened = (byte & 4) == 0;
	if (*opened)
		memset(sent[node], 0, sizeof(sent[node]));
	return true;
}

/* The deadline of calls sent together, as redis/deadline.c computes it. */
int64
deadline_for_calls_us(int ncalls, int command_timeout_ms)
{
	return (int64) command_timeout_ms * 1000 * (1 + (Max(ncalls, 1) - 1) / 1000);
}

/* A question on the side (the slot map asked of another master): answered as the tape says. */
bool
connection_ask(int node, int argc, const char *const *argv, int64 deadline,
			   ExchangeReplyHandler handler, void *arg)
{
	RedisFailure failure = {0};
	bool		opened;

	if (!connection_open(node, deadline, &opened, &failure))
		return false;
	connection_begin(node);
	resp_append_command(connection_output(), argc, argv);
	return connection_exchange(node, 1, deadline, 0, handler, arg, &failure);
}

/* Where the pipeline writes the commands of the exchange under way. */
StringInfo
connection_output(void)
{
	return &output;
}

/* A request starts: its commands are written from scratch. */
void
connection_begin(int node)
{
	resetStringInfo(&output);
}

/* How many whole commands out holds; a finding if it holds anything else. */
static int
count_commands(const StringInfo out)
{
	int			count = 0;
	size_t		at = 0;

	while (at < (size_t) out->len)
	{
		RespScanner scanner;
		size_t		length;

		resp_scanner_start(&scanner);
		FUZZ_CHECK(resp_scan(&scanner, out->data + at, out->len - at, &length) == RESP_COMPLETE);
		FUZZ_CHECK(out->data[at] == '*');
		at += length;
		count++;
	}
	return count;
}

/*
 * Hands the next nreplies whole replies on the tape to handler, each in an
 * exact-size heap copy; a reply that is not whole breaks the connection.
 */
bool
connection_exchange(int node, int nreplies, int64 deadline, int64 idle_us,
					ExchangeReplyHandler handler, void *arg, RedisFailure *failure)
{
	FUZZ_CHECK(nreplies > 0 && count_commands(&output) == nreplies);
	resetStringInfo(&output);
	for (int i = 0; i < nreplies; i++)
	{
		RespScanner scanner;
		size_t		length;
		char	   *reply;
		RespValue	value;

		resp_scanner_start(&scanner);
		if (resp_scan(&scanner, (const char *) tape, tape_left, &length) != RESP_COMPLETE)
		{
			/* Closed before anything came back, or midway: the request may have run. */
			failure->maybe_ran = i > 0 || tape_left > 0;
			tape_left = 0;
			return redis_fail(failure, REDIS_FAILURE_IO, "connection closed");
		}
		reply = shim_copy(tape, length);
		tape += length;
		tape_left -= length;
		resp_read(reply, &value);
		handler(i, &value, arg);
		pfree(reply);
	}
	return true;
}

/* The request is complete: nothing to keep here. */
void
connection_done(int node)
{
}

/* A node that cannot serve: its next opening is a new connection anyway. */
void
connection_discard(int node)
{
}

/* No connection outlives an input here. */
void
connection_close_stale(void)
{
}

/* As connection.c: true when sent on this connection before, else noted. */
bool
connection_script_sent(int node, const LuaScript *script)
{
	for (int i = 0; i < (int) lengthof(sent[node]); i++)
	{
		if (sent[node][i] == script)
			return true;
		if (sent[node][i] == NULL)
		{
			sent[node][i] = script;
			return false;
		}
	}
	return false;
}

/* Every node has the one breaker, open or probing when the tape says so. */
static int	breaker;
static bool breaker_opened;

/* The one breaker every node shares here. */
BreakerState *
breaker_for(const char *node)
{
	return (BreakerState *) &breaker;
}

/* Open (the node skipped) or probing as the tape says. */
bool
breaker_begin(BreakerState *state, bool *probing)
{
	uint8_t		byte = tape_byte();

	*probing = (byte & 2) != 0;
	breaker_opened |= (byte & 1) != 0;
	return (byte & 1) == 0;
}

/* Takes a node's outcome, which must be of a known kind. */
void
breaker_end(BreakerState *state, const RedisFailure *failure)
{
	FUZZ_CHECK(failure != NULL && failure->kind < REDIS_FAILURE_KINDS);
}

/* A timeout of calls sent together stays as it is: no PING is asked here. */
void
breaker_weigh(int node, RedisFailure *failure)
{
}

/* A probe cut off by an error: none is raised here. */
void
breaker_abandon(BreakerState *state)
{
}

/* No wait: the breaker never stays open. */
int64
breaker_retry_after_ms(BreakerState *state)
{
	return 0;
}

/* Closed whenever the slot map is looked for elsewhere. */
bool
breaker_is_open(BreakerState *state)
{
	return false;
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: a URL, the calls, the tape of breakers, openings and replies. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static bool defined = false;
	RedisCall	calls[CALLS_MAX];
	const char *keys[CALLS_MAX][1];
	const char *args[2] = {"1000", "5"};
	long long	results[CALLS_MAX][4];
	static const char *const subjects[] = {"rl:{a}:x", "rl:{b}:x", "rl:{tenant_7f2}:x", "rl:{a}:y"};
	RedisFailure failure;
	bool		all;
	bool		every = true;
	int			ncalls;

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
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", ""));
		cluster_prepare();
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", urls[input[0] % lengthof(urls)]));
		initStringInfo(&output);
		tape = input + 2;
		tape_left = size - 2;
		breaker_opened = false;

		ncalls = 1 + (input[1] & 3);
		memset(calls, 0, sizeof(calls));
		for (int i = 0; i < ncalls; i++)
		{
			keys[i][0] = subjects[(input[1] >> 2 >> i) & 3];
			calls[i].script = &scripts[(input[1] >> 6 >> (i & 1)) & 1];
			calls[i].nkeys = 1;
			calls[i].keys = keys[i];
			calls[i].nargs = 2;
			calls[i].args = args;
			calls[i].nresults = calls[i].script == &scripts[0] ? 4 : 1;
			calls[i].results = results[i];
		}

		all = redis_run_scripts(calls, ncalls, 0, &failure);
		for (int i = 0; i < ncalls; i++)
		{
			RedisCall  *call = &calls[i];

			FUZZ_CHECK(call->answered || call->done);
			FUZZ_CHECK(!call->answered || call->failure.kind == REDIS_FAILURE_NONE);
			FUZZ_CHECK(call->failure.kind < REDIS_FAILURE_KINDS);
			FUZZ_CHECK(call->redirects <= 5);
			FUZZ_CHECK(memchr(call->failure.detail, '\0', sizeof(call->failure.detail)) != NULL);
			FUZZ_CHECK(memchr(call->failure.node, '\0', sizeof(call->failure.node)) != NULL);
			every &= call->answered;
		}
		/* True when every call was answered; else why not (none: a breaker was open). */
		FUZZ_CHECK(all == every);
		FUZZ_CHECK(all || failure.kind != REDIS_FAILURE_NONE || breaker_opened);
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
