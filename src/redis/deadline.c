/*
 * deadline.c
 *	  How long a call may wait for Redis: this session's deadlines, and the
 *	  server's own.
 *
 * Any role may shorten ratelimit.connect_timeout and ratelimit.command_timeout
 * for itself (a procedure chooses its own deadline). The server's own are the
 * postmaster's values, which come only from postgresql.conf, ALTER SYSTEM and
 * its command line, never from a role, a database, a startup packet or a SET:
 * with shared memory they are kept there (the postmaster writes them when a
 * reload changes them), and the shared breaker compares a session's deadlines
 * with them. Without it, a backend's own are the only ones it knows.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "redis/deadline.h"

int			deadline_connect_timeout_ms = 1000;
int			deadline_command_timeout_ms = 250;

typedef struct ServerDeadlines
{
	pg_atomic_uint32 connect_timeout_ms;
	pg_atomic_uint32 command_timeout_ms;
} ServerDeadlines;

static ServerDeadlines *server = NULL;

/* In the postmaster: its values, for the shared memory created after they are set. */
static int	postmaster_connect_timeout_ms = 1000;
static int	postmaster_command_timeout_ms = 250;

/* In the postmaster, a value about to be assigned is the server's own. */
static void
assign_connect_timeout(int newval, void *extra)
{
	if (IsUnderPostmaster)
		return;
	postmaster_connect_timeout_ms = newval;
	if (server != NULL)
		pg_atomic_write_u32(&server->connect_timeout_ms, (uint32) newval);
}

static void
assign_command_timeout(int newval, void *extra)
{
	if (IsUnderPostmaster)
		return;
	postmaster_command_timeout_ms = newval;
	if (server != NULL)
		pg_atomic_write_u32(&server->command_timeout_ms, (uint32) newval);
}

/* Defines the two deadlines; called once per process from _PG_init. */
void
deadline_init(void)
{
	DefineCustomIntVariable("ratelimit.connect_timeout",
							"Longest wait to connect and authenticate to Redis.",
							NULL, &deadline_connect_timeout_ms, 1000, 1, 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS, NULL, assign_connect_timeout, NULL);
	DefineCustomIntVariable("ratelimit.command_timeout",
							"Longest wait for Redis to answer one decision.",
							"When it passes, the policy's fail mode decides.",
							&deadline_command_timeout_ms, 250, 1, 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS, NULL, assign_command_timeout, NULL);
}

/* Shared memory the server's deadlines need when preloaded. */
Size
deadline_shmem_size(void)
{
	return MAXALIGN(sizeof(ServerDeadlines));
}

/* Attaches to (or creates) them; called with AddinShmemInitLock held. */
void
deadline_shmem_init(void)
{
	bool		found;

	server = ShmemInitStruct("ratelimit server deadlines", sizeof(ServerDeadlines), &found);
	if (!found)
	{
		pg_atomic_init_u32(&server->connect_timeout_ms, postmaster_connect_timeout_ms);
		pg_atomic_init_u32(&server->command_timeout_ms, postmaster_command_timeout_ms);
	}
}

/* The server's own connect_timeout (this backend's, without shared memory). */
int
deadline_server_connect_timeout_ms(void)
{
	return server != NULL ? (int) pg_atomic_read_u32(&server->connect_timeout_ms) :
		deadline_connect_timeout_ms;
}

/* The server's own command_timeout (this backend's, without shared memory). */
int
deadline_server_command_timeout_ms(void)
{
	return server != NULL ? (int) pg_atomic_read_u32(&server->command_timeout_ms) :
		deadline_command_timeout_ms;
}

/*
 * How long ncalls script calls sent together may take to answer, in µs:
 * command_timeout_ms for each thousand begun. Redis runs them one after
 * another, so a deadline that did not grow with them would fail a large
 * batch, a rollback's refunds or a commit's releases while Redis is healthy,
 * and say nothing of Redis when it passed.
 */
int64
deadline_for_calls_us(int ncalls, int command_timeout_ms)
{
	return (int64) command_timeout_ms * 1000 * (1 + (Max(ncalls, 1) - 1) / 1000);
}
