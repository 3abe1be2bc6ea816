/*
 * buckets.c
 *	  Emergency token buckets in shared memory, for fail_mode 'local'.
 *
 * While Redis cannot answer, a 'local' policy decides from a bucket that every
 * backend of this server shares, with the same arithmetic as the Redis script
 * (each algorithm's C model, algorithm/). The table (local/table.c) has
 * ratelimit.local_buckets slots. When a subject's probes are all taken, a slot whose
 * bucket has refilled completely is reused: forgetting a full bucket loses
 * nothing, since a new bucket starts full. If none is full, the decision is a
 * denial, so a full table can never grant more than the policy allows.
 * A slot is a subject's only when its placing hash and its keyed check
 * agree (local/keys.c): no subject can be made to share another's bucket.
 */
#include "prelude.h"

#include "port/atomics.h"

#include "local/buckets.h"
#include "local/table.h"

/* One bucket. The parameters tell stale state from current. */
typedef struct LocalSlot
{
	LocalKey	key;			/* first, as local/table.c wants it */
	Algorithm	algorithm;
	WindowCalendar calendar;
	int64		capacity;
	int64		unit;
	int64		rate;
	int64		window_ms;
	SubjectState state;
} LocalSlot;

/* The table's header: the slots in use, for rl_health. */
static void
header_init(void *header)
{
	pg_atomic_init_u32(header, 0);
}

SharedTable local_buckets_table = {
	.name = "ratelimit local buckets",
	.slot_size = sizeof(LocalSlot),
	.partitions = 16,
	.probes = 8,
	.setting = "ratelimit.local_buckets",
	.description = "Slots for local fallback buckets in shared memory.",
	.size = 10000,
	.size_min = 128,
	.size_max = 10 * 1000 * 1000,
	.header_size = sizeof(pg_atomic_uint32),
	.header_init = header_init,
};

/* True when the library was preloaded, so that local buckets exist. */
bool
local_available(void)
{
	return table_available(&local_buckets_table);
}

/* True when a slot's stored state was made with these parameters. */
static bool
slot_matches(const LocalSlot *slot, const LimitParams *params)
{
	return slot->algorithm == params->algorithm && slot->capacity == params->capacity &&
		slot->unit == params->unit && slot->rate == params->rate &&
		slot->window_ms == params->window_ms && slot->calendar == params->calendar;
}

/* The parameters a slot's bucket was made with: params, in the slot's own terms. */
static LimitParams
slot_params(const LocalSlot *slot, const LimitParams *params)
{
	LimitParams own = *params;

	own.algorithm = slot->algorithm;
	own.calendar = slot->calendar;
	own.capacity = slot->capacity;
	own.unit = slot->unit;
	own.rate = slot->rate;
	own.capacity_units = slot->capacity * slot->unit;
	own.window_ms = slot->window_ms;
	return own;
}

/* Makes slot's parameters params'. */
static void
slot_set_params(LocalSlot *slot, const LimitParams *params)
{
	slot->algorithm = params->algorithm;
	slot->calendar = params->calendar;
	slot->capacity = params->capacity;
	slot->unit = params->unit;
	slot->rate = params->rate;
	slot->window_ms = params->window_ms;
}

/*
 * The policy's local bucket changed (capacity or local_share): keep the whole
 * tokens the old bucket held at now_ms, at most the new capacity (a window:
 * what it has counted), so that a change never hands out a fresh full bucket.
 */
static void
slot_convert(LocalSlot *slot, const LimitParams *params, int64 now_ms)
{
	LimitParams old = slot_params(slot, params);
	LimitResult held;

	int64		tokens;

	limit_ops(&old)->apply(&old, &slot->state, now_ms, 0, LIMIT_PEEK, &held);
	/* A bucket keeps the tokens it holds; a window, the tokens it has counted. */
	tokens = limit_refills(params->algorithm) ? held.remaining :
		Max(params->capacity - (old.capacity - held.remaining), 0);
	if (old.algorithm != params->algorithm)
		limit_ops(params)->state_new(params, &slot->state, now_ms);
	slot_set_params(slot, params);
	limit_ops(params)->state_holding(params, &slot->state, now_ms, tokens);
}

/* What the eviction rule of local_apply knows: the policy, the time, and what it saw. */
typedef struct Reuse
{
	const LimitParams *params;
	int64		now_ms;
	int64		soonest_full;	/* of the buckets kept: how long until one has refilled */
} Reuse;

/*
 * The eviction rule: a bucket that has refilled completely gives way
 * (forgetting a full bucket loses nothing, since a new one starts full);
 * of the others, how long until the first is full.
 */
static bool
reusable(void *slot, void *arg, int64 *rank)
{
	LocalSlot  *local = slot;
	Reuse	   *reuse = arg;
	/* A bucket is judged by the parameters it was made with. */
	LimitParams own = slot_params(local, reuse->params);
	LimitResult probe;
	SubjectState copy = local->state;

	*rank = 0;
	if (limit_ops(&own)->is_idle(&own, &local->state, reuse->now_ms))
		return true;
	/* How long until this one is full: a cost-free look at it. */
	limit_ops(&own)->apply(&own, &copy, reuse->now_ms, 0, LIMIT_PEEK, &probe);
	reuse->soonest_full = Min(reuse->soonest_full, probe.reset_after_ms);
	return false;
}

/*
 * Decides from the local bucket of key (database, policy, version and
 * subject: local/keys.c), in mode (take, peek or refund). Cost must not
 * exceed params->capacity.
 */
void
local_apply(const LimitParams *params, const LocalKey *key, int64 now_ms, int64 cost,
			LimitMode mode, LimitResult *result)
{
	Reuse		reuse = {.params = params, .now_ms = now_ms, .soonest_full = PG_INT64_MAX};
	int			partition;
	LocalSlot  *chosen;
	TableClaim	how;

	Assert(key->hash != 0 && cost >= 0 && cost <= params->capacity);
	partition = table_lock(&local_buckets_table, key, LW_EXCLUSIVE);
	chosen = table_claim(&local_buckets_table, key, reusable, &reuse, &how);
	if (chosen != NULL && how != TABLE_FOUND)
	{
		/* A new bucket, full, as a missing Redis key is. */
		if (how == TABLE_WAS_EMPTY)
			pg_atomic_fetch_add_u32(local_buckets_table.header, 1);
		slot_set_params(chosen, params);
		limit_ops(params)->state_new(params, &chosen->state, now_ms);
	}
	else if (chosen != NULL && !slot_matches(chosen, params))
		slot_convert(chosen, params, now_ms);
	if (chosen != NULL)
		limit_ops(params)->apply(params, &chosen->state, now_ms, cost, mode, result);
	table_unlock(&local_buckets_table, partition);

	if (chosen == NULL)
	{
		/* No room: deny until one of the buckets in the way has refilled. */
		result->allowed = false;
		result->remaining = 0;
		result->retry_after_ms = Max(reuse.soonest_full, 1);
		result->reset_after_ms = result->retry_after_ms;
	}
}

/* Slots in use and slots in all, for rl_health(); zeros without preload. */
void
local_usage(int *in_use, int *slots)
{
	*in_use = local_buckets_table.header ? (int) pg_atomic_read_u32(local_buckets_table.header) : 0;
	*slots = table_size(&local_buckets_table);
}
