/*
 * fuzz_sentinel.c
 *	  Fuzz target: sentinel_find_master, with sentinels that answer whatever
 *	  the fuzzer says, through the real exchange.c (reply buffers, scans
 *	  resumed as bytes arrive) and the static found_master reading each reply.
 *	  A master found has a host (not empty) and a port in range; a search
 *	  that finds none says why. What the backend sends is well-formed commands.
 *
 * Fuzzed through the public function rather than found_master alone: stream.c
 * is the only thing faked (below), so the replies take the path they take
 * in a server. The input is a byte choosing the URL, a byte saying how bytes
 * arrive (its low seven bits: how many per read, 127 for 16384; its high
 * bit: the sentinel closes the connection once it has said everything,
 * else it goes silent until the deadline), then what the sentinels send, to
 * one connection after the other: a reply is sent once its command has come
 * (the bytes of a reply that is not whole, once any command has). Each input
 * asks twice, the second time on the connection kept from the first when it
 * is.
 */
#include "prelude.h"

#include "storage/latch.h"

#include "redis/resp.h"
#include "redis/sentinel.h"
#include "redis/stream.h"
#include "redis/url.h"

#include "shim.h"

static const char *const urls[] = {
	"redis-sentinel://127.0.0.1:26379/mymaster",
	"redis-sentinel://s1:26379,s2:26380,[::1]:26381/mymaster?sentinel_user=watcher",
	"rediss-sentinel://s1,s2/cache-7?db=3",
};

/* What the fake sentinels send, and how; tape[0 .. sendable) answers the commands come. */
static const uint8_t *tape;
static size_t tape_left;
static size_t sendable;
static size_t read_size;
static bool close_at_end;
static int	input_number = 0;	/* opening in an earlier input: closed meanwhile */

/* A connection: sock 1 is open, and the input it was opened in is in event. */
bool
stream_open(RedisStream *stream, const RedisEndpoint *endpoint, bool tls, int timeout_ms,
			int64 deadline, int64 *connect_deadline, RedisFailure *failure)
{
	FUZZ_CHECK(!stream_is_open(stream));
	FUZZ_CHECK(endpoint->host != NULL && endpoint->host[0] != '\0');
	FUZZ_CHECK(endpoint->port >= 1 && endpoint->port <= 65535);
	stream->socket.sock = 1;
	stream->socket.event = input_number;
	sendable = 0;
	stream->use_tls = tls;
	*connect_deadline = deadline;
	return true;
}

bool
stream_is_open(const RedisStream *stream)
{
	return stream->socket.sock != PGINVALID_SOCKET;
}

/* One kept from an earlier input was closed by its sentinel meanwhile. */
bool
stream_idle_and_open(RedisStream *stream)
{
	return stream_is_open(stream) && stream->socket.event == input_number;
}

void
stream_close(RedisStream *stream)
{
	stream->socket.sock = PGINVALID_SOCKET;
}

/* Readable while replies are due (or the sentinel closes); else the deadline passes. */
uint32
stream_wait(RedisStream *stream, uint32 events, int64 deadline)
{
	FUZZ_CHECK(stream_is_open(stream));
	if (sendable > 0 || (close_at_end && tape_left == 0))
		return events & (WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE);
	return 0;
}

/* One more reply is due: the next whole one on the tape, or the rest of it. */
static void
reply_due(void)
{
	RespScanner scanner;
	size_t		length;

	resp_scanner_start(&scanner);
	if (resp_scan(&scanner, (const char *) tape + sendable, tape_left - sendable,
				  &length) == RESP_COMPLETE)
		sendable += length;
	else
		sendable = tape_left;
}

/* Takes every byte, and checks they are whole commands: arrays of bulk strings. */
ssize_t
stream_send(RedisStream *stream, const char *data, size_t length)
{
	size_t		at = 0;

	FUZZ_CHECK(stream_is_open(stream));
	while (at < length)
	{
		RespScanner scanner;
		size_t		command_length;
		RespValue	command;
		RespValue	argument;
		RespIterator arguments;

		resp_scanner_start(&scanner);
		FUZZ_CHECK(resp_scan(&scanner, data + at, length - at, &command_length) == RESP_COMPLETE);
		resp_read(data + at, &command);
		FUZZ_CHECK(command.type == RESP_ARRAY && command.length > 0);
		resp_iterate(&command, &arguments);
		while (resp_next(&arguments, &argument))
			FUZZ_CHECK(argument.type == RESP_BULK && !argument.null);
		at += command_length;
		reply_due();
	}
	return length;
}

/* Gives the next bytes due, at most read_size; 0 (closed) at the tape's end. */
ssize_t
stream_receive(RedisStream *stream, char *buffer, size_t length)
{
	size_t		n = Min(Min(length, read_size), sendable);

	FUZZ_CHECK(stream_is_open(stream));
	if (n == 0 && !(close_at_end && tape_left == 0))
	{
		errno = EAGAIN;
		return -1;
	}
	memcpy(buffer, tape, n);
	tape += n;
	tape_left -= n;
	sendable -= n;
	return n;
}

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
	input_number++;
	text = urls[input[0] % lengthof(urls)];
	FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", text));
	FUZZ_CHECK(redis_url_parse(text, &url, &problem));
	read_size = (input[1] & 0x7f) == 0x7f ? 16384 : (input[1] & 0x7f) + 1;
	close_at_end = (input[1] & 0x80) != 0;
	tape = input + 2;
	tape_left = size - 2;

	find_master(&url);
	find_master(&url);
	shim_end();
	return 0;
}
