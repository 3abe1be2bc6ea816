/*
 * handoff.c
 *	  ratelimit.redis_connections = shared: the shared memory through which a
 *	  backend hands its exchange with a Redis node to the server's one
 *	  connection to that node, kept by a background worker (worker.c).
 *
 * A channel is one node as a backend names it (the URL, the target, the
 * node's address) and the worker that holds its connection; it is taken by
 * the first backend that needs it, which starts the worker. A slot is one
 * backend's (by its PGPROC number): the commands of its exchange, then the
 * replies or why there are none. A slot goes
 *   FREE or DONE -> QUEUED   the backend wrote its commands and queued them
 *   QUEUED -> SENT           the worker copied them into its next pipeline
 *   SENT -> DONE             the worker copied the replies back, or a failure
 * and the latch of whoever waits is set at each step. A backend that stops
 * waiting (its deadline, a cancel) takes a QUEUED request back, nothing sent;
 * a SENT one is left ABANDONED, its reply dropped when it comes, and the call
 * counts as one that may have run, as a backend's own connection cut off does.
 * The ticket, bumped at each request, keeps a late reply out of the next.
 *
 * One LWLock guards it all: each hold copies a few bytes, never waits for I/O.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "redis/deadline.h"
#include "redis/handoff_memory.h"
#include "redis/resp.h"
#include "redis/socket.h"

typedef enum RedisConnectionsMode
{
	CONNECTIONS_BACKEND,
	CONNECTIONS_SHARED
} RedisConnectionsMode;

static const struct config_enum_entry connections_options[] = {
	{"backend", CONNECTIONS_BACKEND, false},
	{"shared", CONNECTIONS_SHARED, false},
	{NULL, 0, false}
};

static int	connections_mode = CONNECTIONS_BACKEND;
HandoffShared *handoff_shared = NULL;
HandoffSlot *handoff_slots = NULL;
int		   *handoff_queues = NULL;

void
handoff_init(void)
{
	/* A server-start setting can be defined only while the server starts. */
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomEnumVariable("ratelimit.redis_connections",
							 "How backends reach Redis: each with its own connections (backend), or through one pipelined connection per node and server (shared).",
							 "shared needs ratelimit in shared_preload_libraries and a background worker per Redis node.",
							 &connections_mode, CONNECTIONS_BACKEND, connections_options,
							 PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

static Size
slots_size(void)
{
	return mul_size(MaxBackends, sizeof(HandoffSlot));
}

Size
handoff_shmem_size(void)
{
	if (connections_mode != CONNECTIONS_SHARED)
		return 0;
	return add_size(add_size(MAXALIGN(sizeof(HandoffShared)), slots_size()),
					mul_size(mul_size(MaxBackends, HANDOFF_CHANNELS), sizeof(int)));
}

void
handoff_shmem_request(void)
{
	if (connections_mode == CONNECTIONS_SHARED)
		RequestNamedLWLockTranche("ratelimit connections", 1);
}

/* Creates or attaches to the channels and slots; called with AddinShmemInitLock held. */
void
handoff_shmem_init(void)
{
	bool		found;

	if (connections_mode != CONNECTIONS_SHARED)
		return;
	handoff_shared = ShmemInitStruct("ratelimit connections", sizeof(HandoffShared), &found);
	handoff_slots = ShmemInitStruct("ratelimit connection slots", slots_size(), &found);
	handoff_queues = ShmemInitStruct("ratelimit connection queues",
							 mul_size(mul_size(MaxBackends, HANDOFF_CHANNELS), sizeof(int)), &found);
	if (!found)
	{
		memset(handoff_shared, 0, sizeof(HandoffShared));
		if (!pg_strong_random(&handoff_shared->boot, sizeof(handoff_shared->boot)))
			elog(FATAL, "ratelimit: could not generate a random number for its shared memory");
		handoff_shared->lock = &GetNamedLWLockTranche("ratelimit connections")->lock;
		handoff_shared->nslots = MaxBackends;
		for (int i = 0; i < HANDOFF_CHANNELS; i++)
			pg_atomic_init_u64(&handoff_shared->channels[i].progress_us, 0);
		for (int i = 0; i < MaxBackends; i++)
		{
			handoff_slots[i].state = SLOT_FREE;
			handoff_slots[i].ticket = 0;
		}
	}
}

/* True when this process hands its exchanges to the shared connections. */
bool
handoff_enabled(void)
{
	return handoff_shared != NULL && MyProc != NULL && MyProc->pgprocno < handoff_shared->nslots;
}

/* After a worker could not be started, how long until one is tried again. */
#define HANDOFF_WORKER_RETRY_US ((int64) 1000 * 1000)

/* Starts the worker of channel; false when none can be (max_worker_processes). */
static bool
start_worker(int channel)
{
	BackgroundWorker worker = {0};
	BackgroundWorkerHandle *handle;
	HandoffWorkerExtra extra = {handoff_shared->boot, handoff_shared->channels[channel].incarnation};

	/* A database connection to none: seen in pg_stat_activity, as the replication launcher. */
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	/* A worker that stopped (an error, a SIGTERM) is started again a second later. */
	worker.bgw_restart_time = 1;
	strlcpy(worker.bgw_library_name, "ratelimit", BGW_MAXLEN);
	strlcpy(worker.bgw_function_name, "ratelimit_connection_worker", BGW_MAXLEN);
	snprintf(worker.bgw_name, BGW_MAXLEN, "ratelimit connection %d", channel);
	strlcpy(worker.bgw_type, "ratelimit connection", BGW_MAXLEN);
	worker.bgw_main_arg = Int32GetDatum(channel);
	worker.bgw_notify_pid = 0;
	/* Started again after a crash, with shared memory anew, it finds no channel of its own. */
	StaticAssertStmt(sizeof(extra) <= BGW_EXTRALEN, "bgw_extra too small");
	memcpy(worker.bgw_extra, &extra, sizeof(extra));
	return RegisterDynamicBackgroundWorker(&worker, &handle);
}

/*
 * The channel of node (url, target, host and port; host NULL: the URL's own),
 * taken and its worker started when it has none yet; -1 when there is no
 * room, or no worker. Called with the lock held exclusively.
 */
static int
channel_of(const HandoffNode *node, const char **why)
{
	int			free_channel = -1;
	const char *host = node->host != NULL ? node->host : "";

	if (strlen(node->url) >= HANDOFF_URL_MAX || strlen(host) >= HANDOFF_HOST_MAX ||
		strlen(node->tls) >= HANDOFF_TLS_MAX)
	{
		*why = "the URL, host or TLS settings are too long to share";
		return -1;
	}
	for (int i = 0; i < HANDOFF_CHANNELS; i++)
	{
		HandoffChannel *ch = &handoff_shared->channels[i];

		if (!ch->used)
		{
			if (free_channel < 0)
				free_channel = i;
			continue;
		}
		if (ch->target == node->target && ch->port == node->port &&
			strcmp(ch->host, host) == 0 && strcmp(ch->url, node->url) == 0 &&
			strcmp(ch->tls, node->tls) == 0)
			return i;
	}
	/*
	 * A worker could not be started a moment ago (max_worker_processes): not
	 * tried again at every call of every backend, under the lock, until then.
	 */
	if (free_channel >= 0 && clock_monotonic_us() < handoff_shared->no_worker_until_us)
		*why = "no background worker could be started (max_worker_processes)";
	else if (free_channel >= 0)
	{
		HandoffChannel *ch = &handoff_shared->channels[free_channel];

		strlcpy(ch->url, node->url, sizeof(ch->url));
		strlcpy(ch->tls, node->tls, sizeof(ch->tls));
		strlcpy(ch->host, host, sizeof(ch->host));
		ch->target = node->target;
		ch->port = node->port;
		ch->worker_latch = NULL;
		ch->in_round = false;
		ch->connected = false;
		ch->nqueued = 0;
		ch->node[0] = '\0';
		ch->last_request_us = clock_monotonic_us();
		ch->incarnation++;
		if (start_worker(free_channel))
		{
			ch->used = true;
			return free_channel;
		}
		*why = "no background worker could be started (max_worker_processes)";
		handoff_shared->no_worker_until_us = clock_monotonic_us() + HANDOFF_WORKER_RETRY_US;
	}
	else
		*why = "every channel is in use";
	return -1;
}

/* Says once per backend why it uses its own connection: slower, never wrong. */
static void
log_no_channel(const char *why)
{
	static bool logged = false;

	if (logged)
		return;
	logged = true;
	ereport(LOG,
			(errmsg("ratelimit: no shared connection to a Redis node, this backend uses its own: %s", why),
			 errhint("Raise max_worker_processes: each Redis node in use needs a background worker.")));
}

/* Takes slot off its channel's queue. Called with the lock held exclusively. */
static void
dequeue(HandoffSlot *slot, int number)
{
	HandoffChannel *ch = &handoff_shared->channels[slot->channel];
	int		   *queue = handoff_queue_of(slot->channel);

	for (int i = 0; i < ch->nqueued; i++)
		if (queue[i] == number)
		{
			memmove(&queue[i], &queue[i + 1], (ch->nqueued - i - 1) * sizeof(int));
			ch->nqueued--;
			break;
		}
	slot->state = SLOT_FREE;
}

/*
 * The backend stopped waiting for its request: taken back if not yet sent,
 * else left for the worker to drop its reply. Says so in failure. False when
 * the answer came meanwhile after all (the slot is DONE: read it).
 */
static bool
abandon(HandoffSlot *slot, int64 idle_us, bool cancelled, RedisFailure *failure)
{
	HandoffChannel *ch = &handoff_shared->channels[slot->channel];
	int64		progress;

	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	if (slot->state == SLOT_DONE)
	{
		LWLockRelease(handoff_shared->lock);
		return false;
	}
	memset(failure, 0, sizeof(*failure));
	failure->maybe_ran = slot->state == SLOT_SENT;
	if (slot->state == SLOT_QUEUED)
		dequeue(slot, MyProc->pgprocno);
	else if (slot->state == SLOT_SENT)
		slot->state = SLOT_ABANDONED;
	progress = (int64) pg_atomic_read_u64(&ch->progress_us);
	LWLockRelease(handoff_shared->lock);
	if (cancelled)
	{
		/* This backend stopped waiting: that says nothing of Redis. */
		failure->backend_only = true;
		redis_fail(failure, REDIS_FAILURE_TIMEOUT, ProcDiePending ? "backend terminating" : "cancelled");
	}
	else
	{
		/* Redis answered the connection's other requests lately: not silent. */
		failure->answering = idle_us > 0 && clock_monotonic_us() - progress < idle_us;
		redis_fail(failure, REDIS_FAILURE_TIMEOUT, "no answer in time");
	}
	return true;
}

/* A backend leaving takes its request back: the worker never sends for a gone backend. */
static void
slot_exit(int code, Datum arg)
{
	HandoffSlot *slot = &handoff_slots[MyProc->pgprocno];

	/* An error while it was held (this runs before the locks are let go otherwise). */
	LWLockReleaseAll();
	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	if (slot->state == SLOT_QUEUED)
		dequeue(slot, MyProc->pgprocno);
	else if (slot->state == SLOT_SENT)
		slot->state = SLOT_ABANDONED;
	LWLockRelease(handoff_shared->lock);
}

/*
 * Waits for slot to be DONE until deadline; false, with failure, when it is
 * not (the deadline, or an interrupt this backend may not serve now).
 */
static bool
wait_for_answer(HandoffSlot *slot, int64 deadline, int64 idle_us, RedisFailure *failure)
{
	for (;;)
	{
		int64		now;

		if (slot->state == SLOT_DONE)
		{
			/* What the worker wrote before DONE is read after it. */
			pg_read_barrier();
			return true;
		}
		now = clock_monotonic_us();
		if (now >= deadline || socket_wait_abandoned())
		{
			if (abandon(slot, idle_us, now < deadline, failure))
				return false;
			return true;
		}
		if (WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					  (long) ((deadline - now + 999) / 1000), socket_wait_event()) & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			socket_check_interrupts();
		}
	}
}

/* wait_for_answer; an error raised meanwhile (a cancel) abandons the request first. */
static bool
wait_or_abandon(HandoffSlot *slot, int64 deadline, int64 idle_us, RedisFailure *failure)
{
	volatile bool answered = false;

	PG_TRY();
	{
		answered = wait_for_answer(slot, deadline, idle_us, failure);
	}
	PG_CATCH();
	{
		RedisFailure ignored;

		(void) abandon(slot, idle_us, true, &ignored);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return answered;
}

/* Hands each reply of the DONE slot to handler; false, with failure, when it has none. */
static bool
read_answer(HandoffSlot *slot, ExchangeReplyHandler handler, void *arg, RedisFailure *failure)
{
	const char *data = slot->reply;
	size_t		left = slot->reply_length;

	/* The replies that came whole, even when the rest did not: their calls have answers. */
	for (int i = 0; i < slot->replies; i++)
	{
		RespScanner scanner;
		RespValue	reply;
		size_t		length;

		resp_scanner_start(&scanner);
		if (resp_scan(&scanner, data, left, &length) != RESP_COMPLETE)
		{
			failure->maybe_ran = true;
			return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "malformed reply");
		}
		resp_read(data, &reply);
		handler(i, &reply, arg);
		data += length;
		left -= length;
	}
	if (slot->failure.kind != REDIS_FAILURE_NONE)
	{
		*failure = slot->failure;
		return false;
	}
	return true;
}

/*
 * Runs one exchange on the shared connection to node: request's commands
 * (nreplies replies), answered before deadline, never idle_us without a byte
 * from Redis (0: no such bound), each reply handed to handler as
 * exchange_run does. *channel says which channel carried it, *generation
 * which of its connections. HANDOFF_TOO_LARGE (more than HANDOFF_REQUEST_MAX
 * bytes) or HANDOFF_NONE (no channel, no worker) when it cannot go this way:
 * the backend's own connection takes it. The replies that came whole are
 * handed to handler even when the exchange fails after them.
 */
HandoffOutcome
handoff_exchange(const HandoffNode *node, StringInfo request, int nreplies, int64 deadline,
				 int64 idle_us, ExchangeReplyHandler handler, void *arg, int *channel,
				 uint64 *generation, RedisFailure *failure)
{
	static bool exit_registered = false;
	HandoffSlot *slot = &handoff_slots[MyProc->pgprocno];
	HandoffChannel *ch;
	Latch	   *worker_latch;
	int64		now = clock_monotonic_us();
	int64		wait_deadline = deadline;
	bool		answered;
	const char *why = NULL;

	memset(failure, 0, sizeof(*failure));
	if (request->len > HANDOFF_REQUEST_MAX)
		return HANDOFF_TOO_LARGE;
	if (!exit_registered)
		before_shmem_exit(slot_exit, (Datum) 0);
	exit_registered = true;
	/*
	 * Never QUEUED nor SENT here (a wait that ends takes its request back):
	 * the worker reads no command of this slot now. Should an exit cut that
	 * short, the request is taken back under the lock below.
	 */
	memcpy(slot->request, request->data, request->len);
	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	*channel = channel_of(node, &why);
	if (*channel < 0)
	{
		LWLockRelease(handoff_shared->lock);
		log_no_channel(why);
		return HANDOFF_NONE;
	}
	if (slot->state == SLOT_QUEUED)
		dequeue(slot, MyProc->pgprocno);
	else if (slot->state == SLOT_SENT)
		slot->state = SLOT_ABANDONED;
	ch = &handoff_shared->channels[*channel];
	ch->last_request_us = now;
	slot->ticket++;
	slot->state = SLOT_QUEUED;
	slot->channel = *channel;
	slot->latch = MyLatch;
	slot->nreplies = nreplies;
	slot->command_us = Max(deadline - now, 1);
	slot->idle_us = idle_us;
	slot->request_length = request->len;
	slot->replies = 0;			/* until the worker hands some back */
	slot->reply_length = 0;
	handoff_queue_of(*channel)[ch->nqueued++] = MyProc->pgprocno;
	/*
	 * A worker in a round takes the queue when the round ends: waking it (a signal,
	 * a system call on each side) would only have it go back to waiting for Redis.
	 */
	worker_latch = ch->in_round ? NULL : ch->worker_latch;
	/* A connection still to be opened has connect_timeout, as a backend's own has. */
	if (!ch->connected)
		wait_deadline += (int64) deadline_connect_timeout_ms * 1000;
	LWLockRelease(handoff_shared->lock);
	if (worker_latch != NULL)
		SetLatch(worker_latch);

	answered = wait_or_abandon(slot, wait_deadline, idle_us, failure);
	if (!answered)
		return HANDOFF_FAILED;
	*generation = slot->generation;
	return read_answer(slot, handler, arg, failure) ? HANDOFF_DONE : HANDOFF_FAILED;
}

/* The connection of channel whose generation answered: closed before its next request. */
void
handoff_discard(int channel, uint64 generation)
{
	LWLockAcquire(handoff_shared->lock, LW_EXCLUSIVE);
	handoff_shared->channels[channel].discard = generation;
	LWLockRelease(handoff_shared->lock);
}

/* The node channel's connection is to, as rl_health shows it ("" none). */
void
handoff_node(int channel, char *node, size_t size)
{
	LWLockAcquire(handoff_shared->lock, LW_SHARED);
	strlcpy(node, handoff_shared->channels[channel].connected ? handoff_shared->channels[channel].node : "", size);
	LWLockRelease(handoff_shared->lock);
}
