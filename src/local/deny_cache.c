/*
 * deny_cache.c
 *	  Denials remembered from Redis, in shared memory, until their retry-after:
 *	  a client that hammers a subject already denied costs Redis nothing
 *	  until the cost could be granted again.
 *
 * A denial from Redis with a retry-after is entered under its key (a hash of
 * database, policy, version, installation and subject, verified by a keyed
 * one: local/keys.c) with the cost denied; until its retry-after has passed on this
 * server's clock, the same cost is denied here, with the time still to wait,
 * and a larger one too where its longer wait can be told without Redis
 * (engine/decide.c). Only Redis's answers are remembered, so a cached denial can
 * only last too long (a refund or reset made by another server is not seen
 * here), never grant: refunds and resets made on this server forget the entry,
 * and a denial Redis decided before such a forget is not entered after it (a
 * partition remembers when it last forgot, and a denial asked before then is
 * dropped), so that a refund made here is never hidden.
 * The table has a fixed number of slots (ratelimit.deny_cache_size), in
 * partitions with a lock each; a subject's slot is found by probing a few
 * places from its hash, and when all are taken, the one whose denial ends
 * soonest gives way. Forgetting an entry only means asking Redis again.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "base/clock.h"
#include "local/deny_cache.h"

#define DENY_PARTITIONS 16
#define DENY_PROBES 4
#define DENY_TRANCHE "ratelimit deny cache"

typedef struct DenySlot
{
	LocalKey	key;			/* hash 0: empty */
	DenyEntry	entry;
} DenySlot;

typedef struct DenyTable
{
	int			slots_per_partition;
	/* When each partition last forgot a denial (clock_monotonic_us), under its lock. */
	int64		forgot_us[DENY_PARTITIONS];
	DenySlot	slots[FLEXIBLE_ARRAY_MEMBER];
} DenyTable;

static int	deny_cache_size = 10000;

static DenyTable *table = NULL;
static LWLockPadded *locks = NULL;

static int
slots_per_partition(void)
{
	return deny_cache_size == 0 ? 0 :
		Max((deny_cache_size + DENY_PARTITIONS - 1) / DENY_PARTITIONS, DENY_PROBES);
}

/* Defines ratelimit.deny_cache_size; only when preloaded, since only then is there a table. */
void
deny_cache_init(bool preloaded)
{
	if (!preloaded)
		return;
	DefineCustomIntVariable("ratelimit.deny_cache_size",
							"Slots for denials remembered from Redis in shared memory (0: none).",
							NULL, &deny_cache_size, 10000, 0, 10 * 1000 * 1000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

Size
deny_cache_shmem_size(void)
{
	return add_size(offsetof(DenyTable, slots),
					mul_size(sizeof(DenySlot), mul_size(slots_per_partition(), DENY_PARTITIONS)));
}

void
deny_cache_shmem_request(void)
{
	RequestNamedLWLockTranche(DENY_TRANCHE, DENY_PARTITIONS);
}

/* Attaches to (or creates) the table; called with AddinShmemInitLock held. */
void
deny_cache_shmem_init(void)
{
	bool		found;

	table = ShmemInitStruct("ratelimit deny cache", deny_cache_shmem_size(), &found);
	if (!found)
	{
		memset(table, 0, deny_cache_shmem_size());
		table->slots_per_partition = slots_per_partition();
	}
	locks = GetNamedLWLockTranche(DENY_TRANCHE);
}

/* True when denials can be remembered: preloaded, with slots. */
bool
deny_cache_available(void)
{
	return table != NULL && table->slots_per_partition > 0;
}

/* The partition of key and the first of its probes. */
static DenySlot *
partition_of(const LocalKey *key, int *partition, int *start)
{
	*partition = key->hash % DENY_PARTITIONS;
	*start = (key->hash / DENY_PARTITIONS) % table->slots_per_partition;
	return &table->slots[*partition * table->slots_per_partition];
}

/* True when slot holds key: the placing hash and the keyed check agree. */
static bool
slot_holds(const DenySlot *slot, const LocalKey *key)
{
	return slot->key.hash == key->hash && slot->key.check == key->check;
}

/*
 * True, with the denial in entry, when key has one still holding at now_ms
 * for this cost: the same cost, or (larger) a larger one.
 */
bool
deny_cache_find(const LocalKey *key, int64 cost, bool larger, int64 now_ms, DenyEntry *entry)
{
	int			partition;
	int			start;
	DenySlot   *slots = partition_of(key, &partition, &start);
	bool		found = false;

	LWLockAcquire(&locks[partition].lock, LW_SHARED);
	for (int i = 0; i < DENY_PROBES && !found; i++)
	{
		DenySlot   *slot = &slots[(start + i) % table->slots_per_partition];

		if (slot_holds(slot, key) && slot->entry.until_ms > now_ms &&
			(cost == slot->entry.cost || (larger && cost > slot->entry.cost)))
		{
			*entry = slot->entry;
			found = true;
		}
	}
	LWLockRelease(&locks[partition].lock);
	return found;
}

/*
 * Remembers a denial of key from Redis until entry->until_ms, unless a denial
 * of the partition was forgotten since asked_us (clock_monotonic_us before the
 * take was sent): a refund made here meanwhile may not be in it.
 */
void
deny_cache_remember(const LocalKey *key, const DenyEntry *entry, int64 now_ms, int64 asked_us)
{
	int			partition;
	int			start;
	DenySlot   *slots = partition_of(key, &partition, &start);
	DenySlot   *chosen = NULL;

	LWLockAcquire(&locks[partition].lock, LW_EXCLUSIVE);
	if (table->forgot_us[partition] >= asked_us)
	{
		LWLockRelease(&locks[partition].lock);
		return;
	}
	for (int i = 0; i < DENY_PROBES; i++)
	{
		DenySlot   *slot = &slots[(start + i) % table->slots_per_partition];

		if (slot_holds(slot, key) || slot->key.hash == 0 || slot->entry.until_ms <= now_ms)
		{
			chosen = slot;
			if (slot_holds(slot, key))
				break;
		}
		else if (chosen == NULL || slot->entry.until_ms < chosen->entry.until_ms)
			chosen = slot;
	}
	/* The latest denial of the subject is the one kept (its cost, its wait). */
	chosen->key = *key;
	chosen->entry = *entry;
	LWLockRelease(&locks[partition].lock);
}

/* Forgets key's denial (a refund or reset made here), and any in flight (see deny_cache_remember). */
void
deny_cache_forget(const LocalKey *key)
{
	int			partition;
	int			start;
	DenySlot   *slots = partition_of(key, &partition, &start);

	LWLockAcquire(&locks[partition].lock, LW_EXCLUSIVE);
	table->forgot_us[partition] = clock_monotonic_us();
	for (int i = 0; i < DENY_PROBES; i++)
	{
		DenySlot   *slot = &slots[(start + i) % table->slots_per_partition];

		if (slot_holds(slot, key))
		{
			slot->key.hash = 0;
			slot->entry.until_ms = 0;
		}
	}
	LWLockRelease(&locks[partition].lock);
}
