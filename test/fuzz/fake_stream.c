/*
 * fake_stream.c
 *	  stream.c faked for the fuzz targets: a server that answers whatever the
 *	  input says. A reply is sent once its command has come (the bytes of a
 *	  reply that is not whole, once any command has), in reads of the size the
 *	  input says; once the input is spent the server closes the connection or
 *	  goes silent until the deadline. What the backend sends is checked to be
 *	  whole commands, arrays of bulk strings.
 */
#include "prelude.h"

#include "storage/latch.h"

#include "redis/resp.h"
#include "redis/stream.h"

#include "fake_stream.h"
#include "shim.h"

/* What the fake servers send, and how; tape[0 .. sendable) answers the commands come. */
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
	if (endpoint->path == NULL)
	{
		FUZZ_CHECK(endpoint->host != NULL && endpoint->host[0] != '\0');
		FUZZ_CHECK(endpoint->port >= 1 && endpoint->port <= 65535);
	}
	stream->socket.sock = 1;
	stream->socket.event = input_number;
	sendable = 0;
	stream->use_tls = tls;
	*connect_deadline = deadline;
	return true;
}

/* True while the fake connection is open. */
bool
stream_is_open(const RedisStream *stream)
{
	return stream->socket.sock != PGINVALID_SOCKET;
}

/* One kept from an earlier input was closed by its server meanwhile. */
bool
stream_idle_and_open(RedisStream *stream)
{
	return stream_is_open(stream) && stream->socket.event == input_number;
}

/* Closes the fake connection. */
void
stream_close(RedisStream *stream)
{
	stream->socket.sock = PGINVALID_SOCKET;
}

/* No interrupt is pending here: a wait never ends for one. */
bool
socket_wait_abandoned(void)
{
	return false;
}

/* Readable while replies are due (or the server closes); else the deadline passes. */
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

/*
 * Starts an input: the server sends tape, read_size bytes at most per read,
 * and closes at its end when close_at_end (else goes silent); connections
 * opened for earlier inputs count as closed by the server meanwhile.
 */
void
fake_stream_start(const uint8_t *data, size_t size, size_t reads_of, bool closes)
{
	tape = data;
	tape_left = size;
	sendable = 0;
	read_size = reads_of;
	close_at_end = closes;
	input_number++;
}
