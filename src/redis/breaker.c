/*
 * breaker.c
 *	  Remembers that Redis is down, so that decisions stop waiting for it.
 *
 * After a failure that says Redis cannot serve anyone (connect refused or
 * timed out, a command timed out, TLS or Sentinel failing, a password missing
 * or refused, a new connection dropped at once, a node that is a replica,
 * loading or without its master),
 * decisions skip Redis for ratelimit.retry_interval and go straight to their
 * fail mode. Then one caller, and only one, probes Redis with a real decision;
 * its success closes the breaker for everyone. The breaker is shared, so it
 * moves only on evidence about Redis: failures that come from a Redis that
 * serves (another error reply, an old connection cut once) do not trip it, nor
 * do a backend's own (a cancel or terminate that ended its wait, a deadline
 * shorter than the server's), nor the deadline of many calls sent together
 * passing while Redis still answers (breaker_weigh): one session's large
 * batch, rollback or commit.
 *
 * There is one breaker per node: for a Redis Cluster one per master, so that
 * a dead master sends only its own slots' decisions to their fail mode; any
 * other URL has one, whatever node it reaches (a Sentinel failover keeps it).
 *
 * With shared_preload_libraries the states live in shared memory, so an outage
 * costs the whole server one timeout per retry_interval instead of one per
 * backend; otherwise each backend keeps its own.
 *
 * The hot path reads one atomic: open_until_us, 0 while Redis answers, else the
 * monotonic time until which decisions skip Redis. A probe is claimed by moving
 * open_until_us forward past the probe's own deadline with compare-and-swap.
 */
#include "prelude.h"

#include "common/hashfn.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/clock.h"
#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/url.h"

struct BreakerState
{
	pg_atomic_uint64 open_until_us;
	slock_t		mutex;			/* guards the fields below, changed only on transitions */
	bool		reachable;
	TimestampTz since;
	RedisFailure last_failure;
	TimestampTz last_failure_at;
};

/*
 * The breakers of the nodes, by name: "" for a URL's one node, "host:port"
 * for a cluster node. A name is written once, before in_use is set, and
 * never changes.
 */
#define BREAKER_NODES 64

typedef struct BreakerTable
{
	slock_t		mutex;			/* taken to add a node */
	pg_atomic_uint32 in_use;	/* entries whose name is set */
	char		names[BREAKER_NODES][REDIS_NODE_NAME];
	/* A hash of the last ratelimit.redis_url that used each: rl_health shows the current URL's. */
	uint32		url_hashes[BREAKER_NODES];
	BreakerState states[BREAKER_NODES];
} BreakerTable;

typedef enum BreakerAttempt
{
	BREAKER_CLOSED,				/* Redis answers: try it */
	BREAKER_PROBE,				/* the breaker is open and this caller probes */
	BREAKER_SKIP				/* the breaker is open: decide by the fail mode */
} BreakerAttempt;

int			breaker_retry_interval_ms = 1000;

static BreakerTable *shared_table = NULL;
/* Per target (url.h): this backend's own table, the table in use, when it was chosen. */
static BreakerTable backend_tables[REDIS_MAX_TARGETS];
static BreakerTable *tables[REDIS_MAX_TARGETS];	/* NULL: choose again */
static uint32 tables_chosen_for[REDIS_MAX_TARGETS];	/* redis_url_generation() then */
/* For a node that finds the table full: this backend's own. */
static BreakerState overflow_breaker;

/* Sets a breaker to "Redis answers". */
static void
breaker_state_init(BreakerState *state)
{
	memset(state, 0, sizeof(BreakerState));
	pg_atomic_init_u64(&state->open_until_us, 0);
	SpinLockInit(&state->mutex);
	state->reachable = true;
}

static void
breaker_table_init(BreakerTable *init)
{
	SpinLockInit(&init->mutex);
	pg_atomic_init_u32(&init->in_use, 0);
	for (int i = 0; i < BREAKER_NODES; i++)
		breaker_state_init(&init->states[i]);
}

/*
 * The table this backend uses. The shared one belongs to the server's Redis
 * (ratelimit.redis_url as set for the whole server); a session that SETs another
 * URL keeps its own, so that its Redis cannot open the breakers for everyone.
 */
static BreakerTable *
breaker_table(void)
{
	int			target = redis_url_target();

	/*
	 * A new URL may mean another Redis: the table is chosen again. Each target
	 * (a region's Redis) keeps its own, so that switching between them never
	 * forgets what a breaker knew.
	 */
	if (tables[target] == NULL || tables_chosen_for[target] != redis_url_generation())
	{
		tables_chosen_for[target] = redis_url_generation();
		if (shared_table != NULL && redis_url_is_server_wide())
			tables[target] = shared_table;
		else
		{
			breaker_table_init(&backend_tables[target]);
			tables[target] = &backend_tables[target];
		}
	}
	return tables[target];
}

/* A hash of the URL now, made again when it changes. */
static uint32
url_hash(void)
{
	static uint32 hash = 0;
	static uint32 hashed_for = 0;
	static bool hashed = false;

	if (!hashed || hashed_for != redis_url_generation())
	{
		const char *url = redis_url_current();

		hash = hash_bytes((const unsigned char *) url, strlen(url));
		hashed_for = redis_url_generation();
		hashed = true;
	}
	return hash;
}

/* The entry of node in t, -1 if none. */
static int
breaker_find(BreakerTable *t, const char *node, uint32 count)
{
	for (uint32 i = 0; i < count; i++)
		if (strcmp(t->names[i], node) == 0)
			return i;
	return -1;
}

/*
 * The breaker of a node, by name ("" for the URL's one node): found, or added
 * to the table. A full table leaves the node with this backend's own.
 */
BreakerState *
breaker_for(const char *node)
{
	BreakerTable *t = breaker_table();
	uint32		count = pg_atomic_read_u32(&t->in_use);
	int			found;

	pg_read_barrier();
	found = breaker_find(t, node, count);
	if (found >= 0)
	{
		/* Written only when another URL used it last: no shared write per call. */
		if (t->url_hashes[found] != url_hash())
			t->url_hashes[found] = url_hash();
		return &t->states[found];
	}
	SpinLockAcquire(&t->mutex);
	count = pg_atomic_read_u32(&t->in_use);
	found = breaker_find(t, node, count);
	if (found < 0 && count < BREAKER_NODES)
	{
		strlcpy(t->names[count], node, sizeof(t->names[count]));
		t->url_hashes[count] = url_hash();
		pg_write_barrier();
		pg_atomic_write_u32(&t->in_use, count + 1);
		found = count;
	}
	SpinLockRelease(&t->mutex);
	if (found >= 0)
		return &t->states[found];
	return &overflow_breaker;
}

/* Defines ratelimit.retry_interval; called once per process from _PG_init. */
void
breaker_init(void)
{
	DefineCustomIntVariable("ratelimit.retry_interval",
							"How long decisions skip a Redis that could not be reached before one probe tries again.",
							NULL, &breaker_retry_interval_ms, 1000, 1, 3600 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
}

/* Shared memory the breaker needs when preloaded. */
Size
breaker_shmem_size(void)
{
	return MAXALIGN(sizeof(BreakerTable));
}

/* Attaches to (or creates) the shared breaker; called with AddinShmemInitLock held. */
void
breaker_shmem_init(void)
{
	bool		found;

	shared_table = ShmemInitStruct("ratelimit breakers", sizeof(BreakerTable), &found);
	if (!found)
		breaker_table_init(shared_table);
}

/* True for failures that mean Redis cannot serve anyone now. */
static bool
failure_trips(const RedisFailure *failure)
{
	switch (failure->kind)
	{
		case REDIS_FAILURE_CONNECT:
		case REDIS_FAILURE_TIMEOUT:
		case REDIS_FAILURE_CONFIG:
		case REDIS_FAILURE_TLS:
		case REDIS_FAILURE_SENTINEL:
		case REDIS_FAILURE_AUTH:
			return true;
		case REDIS_FAILURE_IO:
			/* A connection dropped as soon as it was made: Redis drops them all. */
			return failure->new_connection;
		default:
			/* A node that cannot serve anyone (a replica, loading, without its master). */
			return redis_failure_wrong_node(failure->kind);
	}
}

/* The open_until_us this backend wrote when it claimed the probe; 0: none. */
static uint64 claimed_probe = 0;

/*
 * The server's own connect_timeout and command_timeout, for the shared
 * breaker; a backend's own breaker has only the backend's.
 */
static bool
state_is_shared(const BreakerState *state)
{
	return shared_table != NULL && state >= &shared_table->states[0] &&
		state < &shared_table->states[BREAKER_NODES];
}

static int
server_connect_timeout_ms(BreakerState *state)
{
	return state_is_shared(state) ? deadline_server_connect_timeout_ms() :
		deadline_connect_timeout_ms;
}

static int
server_command_timeout_ms(BreakerState *state)
{
	return state_is_shared(state) ? deadline_server_command_timeout_ms() :
		deadline_command_timeout_ms;
}

/*
 * The command_timeout of the server this backend's Redis belongs to: the
 * postmaster's when the breaker is shared, else this session's own (a
 * session that set its own ratelimit.redis_url answers for its own Redis).
 */
int
breaker_server_command_timeout_ms(void)
{
	return breaker_table() == shared_table ? deadline_server_command_timeout_ms() :
		deadline_command_timeout_ms;
}

/*
 * Whether the caller should try Redis: BREAKER_CLOSED (it answers), BREAKER_PROBE
 * (this caller won the one probe), or BREAKER_SKIP.
 */
static BreakerAttempt
breaker_allows_attempt(BreakerState *state)
{
	uint64		until = pg_atomic_read_u64(&state->open_until_us);
	int64		now;
	uint64		probe_until;

	if (until == 0)
		return BREAKER_CLOSED;
	now = clock_monotonic_us();
	if ((uint64) now < until)
		return BREAKER_SKIP;

	/*
	 * Others keep skipping Redis until the probe has had its whole deadline, by
	 * the server-wide timeouts: a session's own longer ones cannot stretch it.
	 */
	probe_until = now + 1 +
		((int64) Min(deadline_connect_timeout_ms, server_connect_timeout_ms(state)) +
		 Min(deadline_command_timeout_ms, server_command_timeout_ms(state))) * 1000;
	if (pg_atomic_compare_exchange_u64(&state->open_until_us, &until, probe_until))
	{
		claimed_probe = probe_until;
		return BREAKER_PROBE;
	}
	/* Someone else probed, or Redis just came back. */
	return until == 0 ? BREAKER_CLOSED : BREAKER_SKIP;
}

/* Hands this backend's unfinished probe on: the next decision may probe at once. */
static void
breaker_release_probe(BreakerState *state)
{
	uint64		claimed = claimed_probe;

	claimed_probe = 0;
	if (claimed != 0)
		pg_atomic_compare_exchange_u64(&state->open_until_us, &claimed,
									   (uint64) clock_monotonic_us());
}

/*
 * True when the failure says nothing about whether Redis can be reached for
 * everyone: a connection lost mid-request (Redis may have restarted, or killed
 * only this client), this backend's own trouble (no file descriptor left, a
 * name it could not resolve), or a timeout shorter than the server-wide one,
 * which a session may choose but must not impose on others.
 */
static bool
failure_is_local(BreakerState *state, const RedisFailure *failure)
{
	if ((failure->kind == REDIS_FAILURE_IO && !failure->new_connection) || failure->backend_only)
		return true;
	if (failure->kind == REDIS_FAILURE_TIMEOUT && state_is_shared(state))
		return deadline_command_timeout_ms < server_command_timeout_ms(state) ||
			deadline_connect_timeout_ms < server_connect_timeout_ms(state);
	return false;
}

/* Records the outcome of an attempt (kind NONE for success). */
static void
breaker_record(BreakerState *state, const RedisFailure *failure)
{
	bool		reachable = !failure_trips(failure);

	if (failure_is_local(state, failure))
	{
		/* Shown, but it moves nothing: it says nothing of Redis for the others. */
		if (failure->kind != REDIS_FAILURE_NONE)
		{
			TimestampTz now = GetCurrentTimestamp();

			SpinLockAcquire(&state->mutex);
			state->last_failure = *failure;
			state->last_failure_at = now;
			SpinLockRelease(&state->mutex);
		}
		breaker_release_probe(state);
		return;
	}
	claimed_probe = 0;
	/* Any answer, even an error reply, shows Redis is there: the breaker closes. */
	if (reachable)
	{
		if (pg_atomic_read_u64(&state->open_until_us) != 0)
			pg_atomic_write_u64(&state->open_until_us, 0);
		/* The common case changes nothing more: no lock on the hot path. */
		if (failure->kind == REDIS_FAILURE_NONE && state->reachable && state->since != 0)
			return;
	}
	else
		pg_atomic_write_u64(&state->open_until_us,
							clock_monotonic_us() + (int64) breaker_retry_interval_ms * 1000);

	{
		TimestampTz now = GetCurrentTimestamp();

		SpinLockAcquire(&state->mutex);
		if (state->reachable != reachable || state->since == 0)
		{
			state->reachable = reachable;
			state->since = now;
		}
		if (failure->kind != REDIS_FAILURE_NONE)
		{
			state->last_failure = *failure;
			state->last_failure_at = now;
		}
		SpinLockRelease(&state->mutex);
	}
}

/*
 * Whether a call to the node of state may go to Redis: true when its breaker
 * is closed, or open and this caller won the one probe (*probing). False when
 * Redis is to be skipped: decide by the fail mode.
 */
bool
breaker_begin(BreakerState *state, bool *probing)
{
	BreakerAttempt allowed = breaker_allows_attempt(state);

	*probing = allowed == BREAKER_PROBE;
	return allowed != BREAKER_SKIP;
}

/* Takes PING's reply (breaker_weigh). */
static void
ping_reply(int index, const RespValue *reply, void *arg)
{
	*(bool *) arg = reply->type == RESP_STATUS;
}

/*
 * Weighs a timeout of node's calls before it goes to the breaker. Calls sent
 * together fail when Redis sends nothing for a command_timeout, which is
 * evidence about Redis, or when their deadline, which grows with them,
 * passes while Redis still answers (failure->answering): that may be the
 * caller's own work (Redis runs them one after another) while Redis serves
 * everyone else, and the breaker is shared. It is evidence only if the node
 * does not answer a PING within the server's deadlines either; else it is
 * marked as this backend's own (backend_only), which moves no shared state.
 */
void
breaker_weigh(int node, RedisFailure *failure)
{
	const char *argv[1] = {"PING"};
	bool		pong = false;
	int64		deadline;

	if (failure->kind != REDIS_FAILURE_TIMEOUT || !failure->answering || failure->backend_only)
		return;
	deadline = clock_monotonic_us() +
		(int64) (deadline_server_connect_timeout_ms() + breaker_server_command_timeout_ms()) * 1000;
	if (!connection_ask(node, 1, argv, deadline, ping_reply, &pong) || !pong)
		return;
	failure->backend_only = true;
	strlcpy(failure->detail, "no answer in time to calls sent together (Redis answers others)",
			sizeof(failure->detail));
}

/* Records the outcome of a call breaker_begin let through (kind NONE for success). */
void
breaker_end(BreakerState *state, const RedisFailure *failure)
{
	breaker_record(state, failure);
}

/*
 * A probe cut short by an error (a cancel) is handed on, so that it cannot
 * keep Redis skipped for its whole deadline.
 */
void
breaker_abandon(BreakerState *state)
{
	breaker_release_probe(state);
}

/*
 * Milliseconds until the node of state will be tried again (at least 1): a
 * closed fail mode's retry-after. A breaker open until a time already past
 * is due for its probe now: the next decision makes it.
 */
int64
breaker_retry_after_ms(BreakerState *state)
{
	int64		until = (int64) pg_atomic_read_u64(&state->open_until_us);
	int64		now = clock_monotonic_us();

	if (until > now)
		return Max((until - now + 999) / 1000, 1);
	if (until != 0)
		return 1;
	return Max(breaker_retry_interval_ms, 1);
}

/* True while the node of state is skipped (its breaker open, a probe under way). */
bool
breaker_is_open(BreakerState *state)
{
	return pg_atomic_read_u64(&state->open_until_us) != 0;
}

/* How many breakers there are, for breaker_health. */
int
breaker_node_count(void)
{
	return (int) pg_atomic_read_u32(&breaker_table()->in_use);
}

/*
 * The state of breaker i (0 .. breaker_node_count() - 1) for rl_health();
 * false when the current ratelimit.redis_url was not the last to use it.
 */
bool
breaker_health(int i, BreakerHealth *health)
{
	BreakerTable *t = breaker_table();
	BreakerState *state = &t->states[i];
	int64		until = (int64) pg_atomic_read_u64(&state->open_until_us);
	int64		now = clock_monotonic_us();

	pg_read_barrier();
	if (t->url_hashes[i] != url_hash())
		return false;
	strlcpy(health->node, t->names[i], sizeof(health->node));
	SpinLockAcquire(&state->mutex);
	health->reachable = state->reachable;
	health->since = state->since;
	health->last_failure = state->last_failure;
	health->last_failure_at = state->last_failure_at;
	SpinLockRelease(&state->mutex);
	health->open = until != 0;
	health->retry_in_ms = until > now ? (until - now + 999) / 1000 : 0;
	health->shared = t == shared_table;
	return true;
}
