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
channel_start(int channel, char **url, char **tls, int *target, char **host, int *port)
{
	HandoffChannel *ch = &handoff_shared->channels[channel];
	bool		used;

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	used = ch->used;
	if (used)
	{
		/* Sent by a worker before this one, which died: they may have run. */
		fail_sent(channel, "the shared connection's worker restarted");
		*url = pstrdup(ch->url);
		*tls = pstrdup(ch->tls);
		*target = ch->target;
		*host = ch->host[0] != '\0' ? pstrdup(ch->host) : NULL;
		*port = ch->port;
		ch->worker_latch = MyLatch;
		ch->in_round = false;
		ch->connected = false;
	}
	LWLockRelease(handoff_shared->lock);
	/* Requests queued while it was starting. */
	SetLatch(MyLatch);
	return used;
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
	while (n < ch->nqueued && n < max)
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
		if (answers[i].failure.kind == REDIS_FAILURE_NONE)
		{
			if (answers[i].length > HANDOFF_REPLY_MAX)
			{
				slot->failure.maybe_ran = true;
				redis_fail(&slot->failure, REDIS_FAILURE_PROTOCOL, "reply too large");
			}
			else
			{
				memcpy(slot->reply, answers[i].replies, answers[i].length);
				slot->reply_length = answers[i].length;
			}
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
	channel_exit(DatumGetInt32(arg));
}

/* Takes one reply, as Redis sent it, into the answer of the request it belongs to. */
static void
take_reply(int index, const RespValue *reply, void *arg)
{
	Round	   *round = arg;
	const char *start;
	size_t		length;

	exchange_reply_bytes(&start, &length);
	while (round->received == round->requests[round->current].nreplies)
	{
		round->current++;
		round->received = 0;
		round->answers[round->current].length = 0;
	}
	if (round->received == 0)
		round->answers[round->current].replies = (const char *) (intptr_t) round->replies.len;
	appendBinaryStringInfo(&round->replies, start, length);
	round->answers[round->current].length += length;
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
			channel_connected(round->channel, NULL);
		}
	}
	for (int i = 0; i < round->nrequests; i++)
	{
		HandoffAnswer *answer = &round->answers[i];
		bool		whole = ok || i < round->current ||
			(i == round->current && round->received == round->requests[i].nreplies);

		if (whole)
			answer->replies = round->replies.data + (intptr_t) answer->replies;
		else
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
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("ratelimit");
	if (!channel_start(round.channel, &round.url, &round.tls, &round.target, &round.host,
					   &round.port))
		proc_exit(0);			/* the channel was given back: nothing to restart */
	tls_settings_use(round.tls);
	before_shmem_exit(worker_exit, main_arg);
	round.connection = connection_create();
	round.max_requests = MaxBackends;
	round.requests = palloc(round.max_requests * sizeof(HandoffRequest));
	round.answers = palloc(round.max_requests * sizeof(HandoffAnswer));
	initStringInfo(&round.commands);
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
