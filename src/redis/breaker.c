/*
 * breaker.c
 *	  Remembers that Redis is down, so that decisions stop waiting for it.
 *
 * After a failure that says Redis cannot serve anyone (connect refused or
 * timed out, a command timed out, TLS or Sentinel failing, a new connection
 * dropped at once, a node that is a replica, loading or without its master),
 * decisions skip Redis for ratelimit.retry_interval and go straight to their
 * fail mode. Then one caller, and only one, probes Redis with a real decision;
 * its success closes the breaker for everyone. Failures that come from a Redis
 * that serves (another error reply, an old connection cut once) do not trip it.
 *
 * With shared_preload_libraries the state lives in shared memory, so an outage
 * costs the whole server one timeout per retry_interval instead of one per
 * backend; otherwise each backend keeps its own.
 *
 * The hot path reads one atomic: open_until_us, 0 while Redis answers, else the
 * monotonic time until which decisions skip Redis. A probe is claimed by moving
 * open_until_us forward past the probe's own deadline with compare-and-swap.
 */
#include "prelude.h"

#include "port/atomics.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "base/clock.h"
#include "redis/breaker.h"
#include "redis/deadline.h"
#include "redis/url.h"

typedef struct BreakerState
{
	pg_atomic_uint64 open_until_us;
	slock_t		mutex;			/* guards the fields below, changed only on transitions */
	bool		reachable;
	TimestampTz since;
	RedisFailure last_failure;
	TimestampTz last_failure_at;
} BreakerState;

typedef enum BreakerAttempt
{
	BREAKER_CLOSED,				/* Redis answers: try it */
	BREAKER_PROBE,				/* the breaker is open and this caller probes */
	BREAKER_SKIP				/* the breaker is open: decide by the fail mode */
} BreakerAttempt;

int			breaker_retry_interval_ms = 1000;

static BreakerState *shared_breaker = NULL;
static BreakerState backend_breaker;
static BreakerState *breaker = NULL;	/* one of the two; NULL: choose again */
static uint32 breaker_chosen_for = 0;	/* redis_url_generation() when it was chosen */

/* Sets a breaker to "Redis answers". */
static void
breaker_state_init(BreakerState *state)
{
	memset(state, 0, sizeof(BreakerState));
	pg_atomic_init_u64(&state->open_until_us, 0);
	SpinLockInit(&state->mutex);
	state->reachable = true;
}

/*
 * The state this backend uses. The shared one belongs to the server's Redis
 * (ratelimit.redis_url as set for the whole server); a session that SETs another
 * URL keeps its own, so that its Redis cannot open the breaker for everyone.
 */
static BreakerState *
breaker_state(void)
{
	/* A new URL may mean another Redis: the breaker is chosen again. */
	if (breaker == NULL || breaker_chosen_for != redis_url_generation())
	{
		breaker_chosen_for = redis_url_generation();
		if (shared_breaker != NULL && redis_url_is_server_wide())
			breaker = shared_breaker;
		else
		{
			breaker_state_init(&backend_breaker);
			breaker = &backend_breaker;
		}
	}
	return breaker;
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
	return MAXALIGN(sizeof(BreakerState));
}

/* Attaches to (or creates) the shared breaker; called with AddinShmemInitLock held. */
void
breaker_shmem_init(void)
{
	bool		found;

	shared_breaker = ShmemInitStruct("ratelimit breaker", sizeof(BreakerState), &found);
	if (!found)
		breaker_state_init(shared_breaker);
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
static int
server_connect_timeout_ms(BreakerState *state)
{
	return state == shared_breaker ? deadline_server_connect_timeout_ms() :
		deadline_connect_timeout_ms;
}

static int
server_command_timeout_ms(BreakerState *state)
{
	return state == shared_breaker ? deadline_server_command_timeout_ms() :
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
	return server_command_timeout_ms(breaker_state());
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
	if (failure->kind == REDIS_FAILURE_TIMEOUT && state == shared_breaker)
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
 * Runs attempt (one Redis call) unless the breaker says to skip Redis, and
 * records its outcome. Returns what attempt returned, or false with failure
 * kind NONE when Redis was skipped. A probe cut short by an error (a cancel)
 * is handed on, so that it cannot keep Redis skipped for its whole deadline.
 */
bool
breaker_call(bool (*attempt) (void *arg, RedisFailure *failure), void *arg,
			 RedisFailure *failure)
{
	BreakerState *state = breaker_state();
	BreakerAttempt allowed = breaker_allows_attempt(state);
	bool		answered;

	memset(failure, 0, sizeof(*failure));
	if (allowed == BREAKER_SKIP)
		return false;
	if (allowed == BREAKER_PROBE)
	{
		PG_TRY();
		{
			answered = attempt(arg, failure);
		}
		PG_CATCH();
		{
			breaker_release_probe(state);
			PG_RE_THROW();
		}
		PG_END_TRY();
	}
	else
		answered = attempt(arg, failure);
	breaker_record(state, failure);
	return answered;
}

/* Milliseconds until Redis will be tried again (at least 1): a closed fail mode's retry-after. */
int64
breaker_retry_after_ms(void)
{
	BreakerState *state = breaker_state();
	int64		until = (int64) pg_atomic_read_u64(&state->open_until_us);
	int64		now = clock_monotonic_us();

	if (until > now)
		return Max((until - now + 999) / 1000, 1);
	return Max(breaker_retry_interval_ms, 1);
}

/* The breaker's state for rl_health(). */
void
breaker_health(BreakerHealth *health)
{
	BreakerState *state = breaker_state();
	int64		until = (int64) pg_atomic_read_u64(&state->open_until_us);
	int64		now = clock_monotonic_us();

	SpinLockAcquire(&state->mutex);
	health->reachable = state->reachable;
	health->since = state->since;
	health->last_failure = state->last_failure;
	health->last_failure_at = state->last_failure_at;
	SpinLockRelease(&state->mutex);
	health->open = until != 0;
	health->retry_in_ms = until > now ? (until - now + 999) / 1000 : 0;
	health->shared = state == shared_breaker;
}
