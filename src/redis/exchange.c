/*
 * exchange.c
 *	  One exchange with Redis: the commands written, sent as far as the stream
 *	  takes them, and the replies read and handed on as each is complete, all
 *	  within one deadline. The buffers are kept between exchanges (those a large
 *	  pipeline grew are given back).
 *
 * Replies are scanned by resp.c, which bounds what a reply may make the
 * backend hold. A failed exchange leaves the stream in an unknown state: the
 * caller closes it.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "redis/exchange.h"
#include "redis/stream.h"

/* Bytes read from the stream at once. */
#define EXCHANGE_READ_CHUNK 16384
/* A buffer grown past this by a large pipeline is freed after use. */
#define EXCHANGE_BUFFER_KEEP 65536

static StringInfoData output;	/* commands to send; output_sent bytes of them are sent */
static int	output_sent = 0;
static StringInfoData input;	/* bytes received; from input_start on, not yet read */
static int	input_start = 0;
static MemoryContext exchange_context = NULL;
static int64 bytes_received = 0;	/* ever, for exchange_run to see that Redis answers */
static bool left_over = false;	/* the last exchange read bytes past its replies */
static const char *reply_start = NULL;	/* the reply being handled, as Redis sent it */
static size_t reply_length = 0;

/* Empties the buffers, and gives back the memory of any that a large pipeline grew. */
void
exchange_reset(void)
{
	if (exchange_context == NULL)
		exchange_context = AllocSetContextCreate(TopMemoryContext, "ratelimit redis buffers",
											  ALLOCSET_SMALL_SIZES);
	if (output.data == NULL || output.maxlen > EXCHANGE_BUFFER_KEEP ||
		input.maxlen > EXCHANGE_BUFFER_KEEP)
	{
		MemoryContext old_context = MemoryContextSwitchTo(exchange_context);

		if (output.data != NULL)
		{
			pfree(output.data);
			pfree(input.data);
		}
		initStringInfo(&output);
		initStringInfo(&input);
		MemoryContextSwitchTo(old_context);
	}
	resetStringInfo(&output);
	resetStringInfo(&input);
	output_sent = 0;
	input_start = 0;
}

/* Sends what the stream takes of the pending output; false on an error. */
static bool
send_output(RedisStream *stream, RedisFailure *failure)
{
	while (output_sent < output.len)
	{
		ssize_t		sent = stream_send(stream, output.data + output_sent,
									   output.len - output_sent);

		if (sent > 0)
			output_sent += sent;
		else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return true;
		else
		{
			failure->maybe_ran = output_sent > 0;
			return redis_fail(failure, REDIS_FAILURE_IO, "write failed");
		}
	}
	return true;
}

/* Reads what the stream has into the input buffer; false at its end or on an error. */
static bool
receive_input(RedisStream *stream, RedisFailure *failure)
{
	ssize_t		received;

	/* What was read already goes; what is left (part of a reply) moves to the front. */
	if (input_start > 0)
	{
		memmove(input.data, input.data + input_start,
				input.len - input_start);
		input.len -= input_start;
		input.data[input.len] = '\0';
		input_start = 0;
	}
	enlargeStringInfo(&input, EXCHANGE_READ_CHUNK);
	received = stream_receive(stream, input.data + input.len, EXCHANGE_READ_CHUNK);
	if (received > 0)
	{
		bytes_received += received;
		input.len += received;
		input.data[input.len] = '\0';
		return true;
	}
	if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return true;
	failure->maybe_ran = output_sent > 0;
	return redis_fail(failure, REDIS_FAILURE_IO, received == 0 ? "connection closed" : "read failed");
}

/*
 * Sends the pending output on stream and reads nreplies replies, handing each
 * to handler as it is complete, before deadline; and, when idle_us is not 0,
 * never more than idle_us without a byte from Redis: a large pipeline has a
 * deadline that grows with it (deadline_for_calls_us), but a Redis that
 * stops answering fails it as soon as it would fail one call. False when
 * the exchange could not be completed, failure saying why and whether the
 * request went out; the caller closes the stream then.
 */
bool
exchange_run(RedisStream *stream, int nreplies, int64 deadline, int64 idle_us,
			 ExchangeReplyHandler handler, void *arg, RedisFailure *failure)
{
	int			received = 0;
	RespScanner scanner;
	int64		progress_us = clock_monotonic_us();

	Assert(stream_is_open(stream));
	resp_scanner_start(&scanner);
	for (;;)
	{
		uint32		events;
		uint32		occurred;

		if (!send_output(stream, failure))
			return false;
		while (received < nreplies)
		{
			const char *start = input.data + input_start;
			size_t		length;
			RespValue	reply;

			switch (resp_scan(&scanner, start, input.len - input_start,
							  &length))
			{
				case RESP_INCOMPLETE:
					break;
				case RESP_COMPLETE:
					resp_read(start, &reply);
					reply_start = start;
					reply_length = length;
					handler(received++, &reply, arg);
					input_start += length;
					resp_scanner_start(&scanner);
					continue;
				case RESP_MALFORMED:
					failure->maybe_ran = true;
					return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "malformed reply");
				case RESP_TOO_LARGE:
					failure->maybe_ran = true;
					return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "reply too large");
			}
			break;
		}
		if (received == nreplies)
		{
			left_over = input_start < input.len;
			exchange_reset();
			return true;
		}
		events = WL_SOCKET_READABLE;
		if (output_sent < output.len)
			events |= WL_SOCKET_WRITEABLE;
		occurred = stream_wait(stream, events,
							   idle_us > 0 ? Min(deadline, progress_us + idle_us) : deadline);
		if (occurred == 0)
		{
			failure->maybe_ran = output_sent > 0;
			/* This backend stopped waiting: that says nothing of Redis. */
			if (socket_wait_abandoned())
			{
				failure->backend_only = true;
				return redis_fail(failure, REDIS_FAILURE_TIMEOUT,
								  ProcDiePending ? "backend terminating" : "cancelled");
			}
			/* The batch's deadline, not command_timeout without a byte from Redis. */
			failure->answering = clock_monotonic_us() < progress_us + idle_us;
			return redis_fail(failure, REDIS_FAILURE_TIMEOUT, "no answer in time");
		}
		if (occurred & WL_SOCKET_READABLE)
		{
			int64		before = bytes_received;

			if (!receive_input(stream, failure))
				return false;
			if (bytes_received != before)
				progress_us = clock_monotonic_us();
		}
	}
}

/* The bytes of the reply being handed to a handler, as Redis sent them (worker.c's). */
void
exchange_reply_bytes(const char **start, size_t *length)
{
	*start = reply_start;
	*length = reply_length;
}

/*
 * True when the last complete exchange read bytes after its replies: Redis
 * sent what no request asked for, and the connection cannot be trusted.
 */
bool
exchange_left_over(void)
{
	return left_over;
}

/* Where the commands of the next exchange are written (resp_append_command). */
StringInfo
exchange_output(void)
{
	if (output.data == NULL)
		exchange_reset();
	return &output;
}
