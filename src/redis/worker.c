/*
 * worker.c
 *	  ratelimit.redis_connections = shared: the background worker that keeps
 *	  the server's one connection to one Redis node (a channel, handoff.c).
 *
 * Each round it takes every request waiting at that moment, writes them in
 * one pipeline, reads the replies and hands each its own, then takes the
 * requests that came meanwhile. Redis pays one read and one write for the
 * round, not one per call. A worker per node: a node that stops answering
 * holds up its own requests only, each within its backend's deadline.
 *
 * The connection is opened as a backend opens its own (connection.c: the
 * server's TLS settings and password file, Sentinel, AUTH, SELECT, ROLE).
 * When it fails, every request of the round gets the failure (a request
 * whose reply came already keeps it) and the next round connects anew. The
 * worker that stops (an error, a SIGTERM) answers what it sent with "may have
 * run"; the postmaster starts it again a second later.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/handoff_memory.h"
#include "redis/failure.h"
#include "redis/socket.h"
#include "redis/tls.h"

PGDLLEXPORT void ratelimit_connection_worker(Datum main_arg);

/* The most bytes of commands in one round: 64 hand-offs of the largest size. */
#define ROUND_BYTES_MAX (64 * HANDOFF_REQUEST_MAX)

/* The worker's node and what its round holds. */
typedef struct Round
{
	int			channel;
	char	   *url;
	char	   *tls;
	int			target;
	char	   *host;
	int			port;
	RedisConnection *connection;
	HandoffRequest *requests;
	HandoffAnswer *answers;
	int			nrequests;
	int			max_requests;
	StringInfoData commands;	/* the round's, in the order of requests */
	StringInfoData replies;		/* as they come, each request's after the one before */
	int			current;		/* the request whose replies come now */
	int			received;		/* of its replies */
} Round;

/* Fails every request of channel sent and not answered: its worker is gone. */
static void
fail_sent(int channel, const char *why)
{
	for (int i = 0; i < handoff_shared->nslots; i++)
	{
		HandoffSlot *slot = &handoff_slots[i];

		if (slot->channel != channel || slot->state != SLOT_SENT)
			continue;
		memset(&slot->failure, 0, sizeof(slot->failure));
		slot->replies = 0;		/* none: what the slot holds is an earlier request's */
		slot->reply_length = 0;
		slot->failure.maybe_ran = true;
		redis_fail(&slot->failure, REDIS_FAILURE_IO, why);
		pg_write_barrier();
		slot->state = SLOT_DONE;
		SetLatch(slot->latch);
	}
}

/*
 * The worker of channel starts: its node, in the caller's memory. False when
 * the channel is not in use (given back; the worker ends for good then).
 */
static bool
channel_start(int channel, const HandoffWorkerExtra *extra, char **url, char **tls,
			  int *target, char **host, int *port)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];
	/* Copied under the lock, allocated after it: an error never leaves it held. */
	char	   *url_copy = palloc(HANDOFF_URL_MAX);
	char	   *tls_copy = palloc(HANDOFF_TLS_MAX);
	char	   *host_copy = palloc(HANDOFF_HOST_MAX);
	bool		mine;

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	/* The channel it was started for: not one taken since, nor one of shared memory before a crash. */
	mine = ch->used && ch->incarnation == extra->incarnation && handoff_shared->boot == extra->boot;
	if (mine)
	{
		/* Sent by a worker before this one, which died: they may have run. */
		fail_sent(channel, "the shared connection's worker restarted");
		memcpy(url_copy, ch->url, HANDOFF_URL_MAX);
		memcpy(tls_copy, ch->tls, HANDOFF_TLS_MAX);
		memcpy(host_copy, ch->host, HANDOFF_HOST_MAX);
		*target = ch->target;
		*port = ch->port;
		ch->worker_latch = MyLatch;
		ch->in_round = false;
		ch->connected = false;
	}
	LWLockRelease(handoff_shared->lock);
	*url = url_copy;
	*tls = tls_copy;
	*host = host_copy[0] != '\0' ? host_copy : NULL;
	/* Requests queued while it was starting. */
	SetLatch(MyLatch);
	return mine;
}

/*
 * Takes every queued request of channel, oldest first (at most max): their
 * commands appended to output, each SENT. *discard says whether the
 * connection is to be closed first.
 */
static int
channel_take(int channel, HandoffRequest *requests, int max, StringInfo output, bool *discard)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];
	int		   *queue = handoff_queue_of(channel);
	int			n = 0;

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	*discard = ch->connected && ch->discard == ch->generation;
	/* As many as the buffer, made at start, holds: nothing is allocated under the lock. */
	while (n < ch->nqueued && n < max &&
		   output->len + handoff_slots[queue[n]].request_length < output->maxlen)
	{
		HandoffSlot *slot = &handoff_slots[queue[n]];

		requests[n].slot = queue[n];
		requests[n].ticket = slot->ticket;
		requests[n].nreplies = slot->nreplies;
		requests[n].command_us = slot->command_us;
		requests[n].idle_us = slot->idle_us;
		appendBinaryStringInfo(output, slot->request, slot->request_length);
		slot->state = SLOT_SENT;
		n++;
	}
	memmove(queue, queue + n, (ch->nqueued - n) * sizeof(int));
	ch->nqueued -= n;
	/* Until the next take: a backend that queues meanwhile need not wake it. */
	ch->in_round = n > 0;
	LWLockRelease(handoff_shared->lock);
	return n;
}

/* Hands back each request's answer, and wakes its backend, unless it stopped waiting. */
static void
channel_answer(int channel, const HandoffRequest *requests, int nrequests,
			   const HandoffAnswer *answers)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];
	static Latch **latches = NULL;
	int			nlatches = 0;

	if (latches == NULL)
		latches = MemoryContextAlloc(TopMemoryContext, handoff_shared->nslots * sizeof(Latch *));
	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < nrequests; i++)
	{
		HandoffSlot *slot = &handoff_slots[requests[i].slot];

		if (slot->ticket != requests[i].ticket || slot->state != SLOT_SENT)
			continue;			/* abandoned: the reply is dropped */
		slot->failure = answers[i].failure;
		/* The whole replies that fit; the calls of the rest may have run. */
		slot->replies = answers[i].fitting;
		slot->reply_length = answers[i].fitting_length;
		memcpy(slot->reply, answers[i].replies, answers[i].fitting_length);
		if (answers[i].fitting < answers[i].count && slot->failure.kind == REDIS_FAILURE_NONE)
		{
			slot->failure.maybe_ran = true;
			redis_fail(&slot->failure, REDIS_FAILURE_PROTOCOL, HANDOFF_REPLY_TOO_LARGE);
		}
		slot->generation = ch->generation;
		pg_write_barrier();
		slot->state = SLOT_DONE;
		latches[nlatches++] = slot->latch;
	}
	LWLockRelease(handoff_shared->lock);
	/* Each woken outside the lock: a wakeup may be a system call. */
	for (int i = 0; i < nlatches; i++)
		SetLatch(latches[i]);
}

/* The worker opened a connection to node (NULL: it closed it). */
static void
channel_connected(int channel, const char *node)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	ch->connected = node != NULL;
	if (node != NULL)
	{
		ch->generation++;
		strlcpy(ch->node, node, sizeof(ch->node));
	}
	LWLockRelease(handoff_shared->lock);
}

/* Redis just sent a reply on channel's connection. */
static void
channel_progress(int channel)
{
	pg_atomic_write_u64(&handoff_shared->channels[channel].progress_us, (uint64) clock_monotonic_us());
}

/*
 * True when channel has had no request for long: it is given back (its
 * worker ends for good, its connection with it).
 */
static bool
channel_idle_exit(int channel)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];
	bool		idle;

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	idle = ch->nqueued == 0 && clock_monotonic_us() - ch->last_request_us > HANDOFF_IDLE_EXIT_US;
	if (idle)
	{
		ch->used = false;
		ch->worker_latch = NULL;
		ch->connected = false;
	}
	LWLockRelease(handoff_shared->lock);
	return idle;
}

/* The worker ends: what it sent and has not answered may have run. */
static void
channel_exit(int channel)
{
	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	/* Unless it gave the channel back (idle), when another worker may have it now. */
	if (handoff_shared->channels[channel].worker_latch == MyLatch)
	{
		fail_sent(channel, "the shared connection's worker stopped");
		handoff_shared->channels[channel].worker_latch = NULL;
		handoff_shared->channels[channel].connected = false;
	}
	LWLockRelease(handoff_shared->lock);
}

static void
worker_exit(int code, Datum arg)
{
	/* An error while it was held (this runs before the locks are let go otherwise). */
	LWLockReleaseAll();
	channel_exit(DatumGetInt32(arg));
}

/* Takes one reply, as Redis sent it, into the answer of the request it belongs to. */
static void
take_reply(int index, const RespValue *reply, void *arg)
{
	Round	   *round = arg;
	HandoffAnswer *answer;
	const char *start;
	size_t		length;

	exchange_reply_bytes(&start, &length);
	while (round->received == round->requests[round->current].nreplies)
	{
		round->current++;
		round->received = 0;
		round->answers[round->current].length = 0;
	}
	answer = &round->answers[round->current];
	if (round->received == 0)
		answer->replies = (const char *) (intptr_t) round->replies.len;
	appendBinaryStringInfo(&round->replies, start, length);
	answer->length += length;
	answer->count++;
	/* What a slot holds: the replies up to the first that would not fit. */
	if (answer->fitting == answer->count - 1 && answer->length <= HANDOFF_REPLY_MAX)
	{
		answer->fitting++;
		answer->fitting_length = answer->length;
	}
	round->received++;
	channel_progress(round->channel);
}

/*
 * The connection, opened if need be within connect_timeout (and the round's
 * latest deadline); false, with failure, when it cannot be.
 */
static bool
round_connect(Round *round, int64 deadline, bool *opened, RedisFailure *failure)
{
	*opened = false;
	/* Checked before every round: its cost is the round's, not each call's. */
	if (connection_ready(round->connection, round->url, 0, deadline))
		return true;
	channel_connected(round->channel, NULL);
	if (!connection_connect(round->connection, round->url, round->target, round->host,
							round->port, deadline, failure))
	{
		/* After a failover the name may point elsewhere: resolved anew next time. */
		socket_forget_address();
		failure->new_connection = true;
		return false;
	}
	*opened = true;
	channel_connected(round->channel, connection_address(round->connection));
	return true;
}

/* Sends the round's requests in one pipeline and hands each its replies or the failure. */
static void
round_run(Round *round)
{
	int64		now = clock_monotonic_us();
	int64		command_us = 0;
	int64		idle_us = 0;
	int			nreplies = 0;
	bool		opened = false;
	bool		ok;
	RedisFailure failure = {0};

	for (int i = 0; i < round->nrequests; i++)
	{
		command_us = Max(command_us, round->requests[i].command_us);
		/* Each request's own bound; one without any (0) lifts it for the round. */
		if (round->requests[i].idle_us == 0)
			idle_us = -1;
		else if (idle_us >= 0)
			idle_us = Max(idle_us, round->requests[i].idle_us);
		nreplies += round->requests[i].nreplies;
		memset(&round->answers[i], 0, sizeof(HandoffAnswer));
	}
	/*
	 * Never shorter than the server's command_timeout: a backend that set a
	 * shorter one stops waiting at its own deadline, but does not get the
	 * server's connection closed (and every other backend's round lost) for it.
	 */
	command_us = Max(command_us, (int64) deadline_server_command_timeout_ms() * 1000);
	if (idle_us > 0)
		idle_us = Max(idle_us, (int64) deadline_server_command_timeout_ms() * 1000);
	resetStringInfo(&round->replies);
	round->current = 0;
	round->received = 0;
	ok = round_connect(round, now + command_us, &opened, &failure);
	if (ok)
	{
		StringInfo	output = exchange_output();

		appendBinaryStringInfo(output, round->commands.data, round->commands.len);
		ok = connection_run(round->connection, nreplies, clock_monotonic_us() + command_us,
							Max(idle_us, 0), take_reply, round, &failure);
		if (!ok)
		{
			failure.new_connection = opened;
			socket_forget_address();
			channel_connected(round->channel, NULL);
		}
	}
	/* Each request its replies; one whose replies did not all come, the failure too. */
	for (int i = 0; i < round->nrequests; i++)
	{
		HandoffAnswer *answer = &round->answers[i];

		answer->replies = round->replies.data + (intptr_t) answer->replies;
		if (answer->count < round->requests[i].nreplies)
			answer->failure = failure;
	}
	channel_answer(round->channel, round->requests, round->nrequests, round->answers);
}

void
ratelimit_connection_worker(Datum main_arg)
{
	Round		round = {.channel = DatumGetInt32(main_arg)};

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	/* A cancel is for a query; the worker runs none (an ERROR here would end it). */
	pqsignal(SIGINT, SIG_IGN);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("ratelimit");
	if (!channel_start(round.channel, (HandoffWorkerExtra *) MyBgworkerEntry->bgw_extra,
					   &round.url, &round.tls, &round.target, &round.host, &round.port))
		proc_exit(0);			/* not its channel (any more): nothing to restart */
	tls_settings_use(round.tls);
	before_shmem_exit(worker_exit, main_arg);
	round.connection = connection_create();
	round.max_requests = MaxBackends;
	round.requests = palloc(round.max_requests * sizeof(HandoffRequest));
	round.answers = palloc(round.max_requests * sizeof(HandoffAnswer));
	/* A round's commands: at most this many bytes (the rest wait for the next round). */
	initStringInfo(&round.commands);
	enlargeStringInfo(&round.commands, ROUND_BYTES_MAX);
	initStringInfo(&round.replies);
	for (;;)
	{
		bool		discard;

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		resetStringInfo(&round.commands);
		round.nrequests = channel_take(round.channel, round.requests, round.max_requests,
									   &round.commands, &discard);
		/* A node that said it cannot serve: the next round connects anew. */
		if (discard)
		{
			connection_close(round.connection);
			socket_forget_address();
			channel_connected(round.channel, NULL);
		}
		if (round.nrequests > 0)
		{
			round_run(&round);
			continue;
		}
		if ((WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10 * 1000,
					   socket_wait_event()) & WL_TIMEOUT) &&
			channel_idle_exit(round.channel))
			proc_exit(0);
	}
}
