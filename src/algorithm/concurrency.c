/*
 * concurrency.c
 *	  Concurrency leases in Redis (lua/concurrency/): a sorted set of lease ids
 *	  scored by expiry per subject, counted without removing the expired ones
 *	  so that every check comes before the first write.
 */
#include "prelude.h"

#include "algorithm/concurrency.h"
#include "base/clock.h"
#include "scripts.h"

static const LuaScript acquire_script = LUA_SCRIPT("concurrency/acquire", script_concurrency_acquire);
static const LuaScript release_script = LUA_SCRIPT("concurrency/release", script_concurrency_release);
static const LuaScript leave_script = LUA_SCRIPT("concurrency/leave", script_concurrency_leave);
static const LuaScript peek_script_plain = LUA_SCRIPT("concurrency/peek", script_concurrency_peek_plain);
static const LuaScript peek_script = LUA_PEEK_SCRIPT("concurrency/peek", script_concurrency_peek, &peek_script_plain);

/*
 * The script of operation. Each takes KEYS[1] the lease set and
 * CONCURRENCY_ARGS arguments, and answers {allowed, free leases,
 * retry_after_ms, reset_after_ms}.
 */
const LuaScript *
concurrency_script(LeaseOperation operation)
{
	switch (operation)
	{
		case LEASE_RELEASE:
			return &release_script;
		case LEASE_PEEK:
			return &peek_script;
		case LEASE_LEAVE:
			return &leave_script;
		case LEASE_ACQUIRE:
			break;
	}
	return &acquire_script;
}

/*
 * The CONCURRENCY_ARGS arguments: the clock (empty: Redis TIME), the capacity
 * in leases, the lease TTL in ms, the lease id (empty for a peek), the
 * waiter's ticket (empty: a take that does not wait) and how long a ticket
 * lives unrenewed; printed in the current memory context.
 */
void
concurrency_args(int64 capacity, int64 ttl_ms, const char *id, const char *ticket,
				 int64 ticket_ttl_ms, const char **args)
{
	args[0] = clock_test_ms();
	args[1] = psprintf(INT64_FORMAT, capacity);
	args[2] = psprintf(INT64_FORMAT, ttl_ms);
	args[3] = id;
	args[4] = ticket;
	args[5] = psprintf(INT64_FORMAT, ticket_ttl_ms);
}

/* The CONCURRENCY_KEYS keys of the lease set key: it, its queue's tickets and their expiries (one slot). */
void
concurrency_keys(const char *key, const char **keys)
{
	keys[0] = key;
	keys[1] = psprintf("%s:queue", key);
	keys[2] = psprintf("%s:queue:alive", key);
}
