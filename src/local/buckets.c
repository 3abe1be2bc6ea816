/*
 * buckets.c
 *	  Emergency token buckets in shared memory, for fail_mode 'local'.
 *
 * While Redis cannot answer, a 'local' policy decides from a bucket that every
 * backend of this server shares, with the same arithmetic as the Redis script
 * (each algorithm's C model, algorithm/). The table has a fixed number of slots (ratelimit.local_buckets),
 * split into partitions, each with its own lock. A subject's slot is found by
 * probing a few places from its hash. When they are all taken, a slot whose
 * bucket has refilled completely is reused: forgetting a full bucket loses
 * nothing, since a new bucket starts full. If none is full, the decision is a
 * denial, so a full table can never grant more than the policy allows.
 * A slot is a subject's only when its placing hash and its keyed check
 * agree (local/keys.c): no subject can be made to share another's bucket.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "local/buckets.h"

#define LOCAL_PARTITIONS 16
#define LOCAL_PROBES 8
#define LOCAL_TRANCHE "ratelimit local buckets"

/* One bucket; key hash 0 marks an empty slot. The parameters tell stale state from current. */
typedef struct LocalSlot
{
	LocalKey	key;
	Algorithm	algorithm;
	WindowCalendar calendar;
	int64		capacity;
	int64		unit;
	int64		rate;
	int64		window_ms;
	BucketState state;
} LocalSlot;

typedef struct LocalTable
{
	int			slots_per_partition;
	pg_atomic_uint32 in_use;
	LocalSlot	slots[FLEXIBLE_ARRAY_MEMBER];
} LocalTable;

static int	local_buckets_setting = 10000;

static LocalTable *table = NULL;
static LWLockPadded *locks = NULL;

/* Slots per partition, from the setting. */
static int
slots_per_partition(void)
{
	return Max((local_buckets_setting + LOCAL_PARTITIONS - 1) / LOCAL_PARTITIONS, LOCAL_PROBES);
}

/*
 * Defines ratelimit.local_buckets, which sizes the shared table: only when
 * preloaded, since only then is there a table.
 */
void
local_init(bool preloaded)
{
	if (!preloaded)
		return;
	DefineCustomIntVariable("ratelimit.local_buckets",
							"Slots for local fallback buckets in shared memory.",
							NULL, &local_buckets_setting, 10000, 128, 10 * 1000 * 1000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* Shared memory the table needs. */
Size
local_shmem_size(void)
{
	return add_size(offsetof(LocalTable, slots),
					mul_size(sizeof(LocalSlot), mul_size(slots_per_partition(), LOCAL_PARTITIONS)));
}

/* Asks for the partition locks; called from the shmem request hook. */
void
local_shmem_request(void)
{
	RequestNamedLWLockTranche(LOCAL_TRANCHE, LOCAL_PARTITIONS);
}

/* Attaches to (or creates) the table; called with AddinShmemInitLock held. */
void
local_shmem_init(void)
{
	bool		found;

	table = ShmemInitStruct("ratelimit local buckets", local_shmem_size(), &found);
	if (!found)
	{
		memset(table, 0, local_shmem_size());
		table->slots_per_partition = slots_per_partition();
		pg_atomic_init_u32(&table->in_use, 0);
	}
	locks = GetNamedLWLockTranche(LOCAL_TRANCHE);
}

/* True when the library was preloaded, so that local buckets exist. */
bool
local_available(void)
{
	return table != NULL;
}

/* True when a slot's stored state was made with these parameters. */
static bool
slot_matches(const LocalSlot *slot, const BucketParams *params)
{
	return slot->algorithm == params->algorithm && slot->capacity == params->capacity &&
		slot->unit == params->unit && slot->rate == params->rate &&
		slot->window_ms == params->window_ms && slot->calendar == params->calendar;
}

/* The parameters a slot's bucket was made with: params, in the slot's own terms. */
static BucketParams
slot_params(const LocalSlot *slot, const BucketParams *params)
{
	BucketParams own = *params;

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
slot_set_params(LocalSlot *slot, const BucketParams *params)
{
	slot->algorithm = params->algorithm;
	slot->calendar = params->calendar;
	slot->capacity = params->capacity;
	slot->unit = params->unit;
	slot->rate = params->rate;
	slot->window_ms = params->window_ms;
}

/* Puts a new bucket for key into slot (full, as a missing Redis key is). */
static void
slot_claim(LocalSlot *slot, const LocalKey *key, const BucketParams *params, int64 now_ms)
{
	slot->key = *key;
	slot_set_params(slot, params);
	limit_ops(params)->state_new(params, &slot->state, now_ms);
}

/*
 * The policy's local bucket changed (capacity or local_share): keep the whole
 * tokens the old bucket held at now_ms, at most the new capacity (a window:
 * what it has counted), so that a change never hands out a fresh full bucket.
 */
static void
slot_convert(LocalSlot *slot, const BucketParams *params, int64 now_ms)
{
	BucketParams old = slot_params(slot, params);
	BucketResult held;

	int64		tokens;

	limit_ops(&old)->apply(&old, &slot->state, now_ms, 0, BUCKET_PEEK, &held);
	/* A bucket keeps the tokens it holds; a window, the tokens it has counted. */
	tokens = limit_refills(params->algorithm) ? held.remaining :
		Max(params->capacity - (old.capacity - held.remaining), 0);
	if (old.algorithm != params->algorithm)
		limit_ops(params)->state_new(params, &slot->state, now_ms);
	slot_set_params(slot, params);
	limit_ops(params)->state_holding(params, &slot->state, now_ms, tokens);
}

/*
 * Decides from the local bucket of key (database, policy, version and
 * subject: local/keys.c), in mode (take, peek or refund). Cost must not
 * exceed params->capacity.
 */
void
local_apply(const BucketParams *params, const LocalKey *key, int64 now_ms, int64 cost,
			BucketMode mode, BucketResult *result)
{
	int			per_partition = table->slots_per_partition;
	int			partition = key->hash % LOCAL_PARTITIONS;
	int			start = (key->hash / LOCAL_PARTITIONS) % per_partition;
	LocalSlot  *slots = &table->slots[partition * per_partition];
	LocalSlot  *chosen = NULL;
	LocalSlot  *empty = NULL;
	LocalSlot  *reusable = NULL;
	int64		soonest_full = PG_INT64_MAX;

	Assert(key->hash != 0 && cost >= 0 && cost <= params->capacity);
	LWLockAcquire(&locks[partition].lock, LW_EXCLUSIVE);
	for (int i = 0; i < LOCAL_PROBES && chosen == NULL; i++)
	{
		LocalSlot  *slot = &slots[(start + i) % per_partition];
		BucketParams own;

		if (slot->key.hash == key->hash && slot->key.check == key->check)
			chosen = slot;
		else if (slot->key.hash == 0)
		{
			if (empty == NULL)
				empty = slot;
		}
		else if (reusable == NULL)
		{
			/* A bucket is judged by the parameters it was made with. */
			own = slot_params(slot, params);
			if (limit_ops(&own)->is_idle(&own, &slot->state, now_ms))
				reusable = slot;
			else
			{
				BucketResult probe;
				BucketState copy = slot->state;

				/* How long until this one is full: a cost-free look at it. */
				limit_ops(&own)->apply(&own, &copy, now_ms, 0, BUCKET_PEEK, &probe);
				soonest_full = Min(soonest_full, probe.reset_after_ms);
			}
		}
	}

	if (chosen != NULL && !slot_matches(chosen, params))
		slot_convert(chosen, params, now_ms);
	else if (chosen == NULL && empty != NULL)
	{
		chosen = empty;
		slot_claim(chosen, key, params, now_ms);
		pg_atomic_fetch_add_u32(&table->in_use, 1);
	}
	else if (chosen == NULL && reusable != NULL)
	{
		chosen = reusable;
		slot_claim(chosen, key, params, now_ms);
	}

	if (chosen != NULL)
		limit_ops(params)->apply(params, &chosen->state, now_ms, cost, mode, result);
	LWLockRelease(&locks[partition].lock);

	if (chosen == NULL)
	{
		/* No room: deny until one of the buckets in the way has refilled. */
		result->allowed = false;
		result->remaining = 0;
		result->retry_after_ms = Max(soonest_full, 1);
		result->reset_after_ms = result->retry_after_ms;
	}
}

/* Slots in use and slots in all, for rl_health(); zeros without preload. */
void
local_usage(int *in_use, int *slots)
{
	*in_use = table ? (int) pg_atomic_read_u32(&table->in_use) : 0;
	*slots = table ? table->slots_per_partition * LOCAL_PARTITIONS : 0;
}
