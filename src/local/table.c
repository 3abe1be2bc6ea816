/*
 * table.c
 *	  A table of fixed-size slots in shared memory, the one shape of the local
 *	  buckets, the deny cache and the slices: a size the user sets (slots in
 *	  all), split into partitions with a lock each; a key's slot is one of a
 *	  few probes from its placing hash, and a slot is a key's only when both
 *	  its placing hash and its keyed check agree (local/keys.c). When every
 *	  probe is taken, the user's rule says which slot gives way, if any.
 *
 * Why not PostgreSQL's ShmemInitHash: a shared dynahash has a fixed budget
 * and fails an insert when it is spent ("out of shared memory"); it cannot
 * give a key's place to another by a rule of the user's. These tables must
 * never fail a decision for lack of room, and each evicts by its own rule
 * (a full bucket, the denial that ends soonest, the least asked slice),
 * among a key's few probes, so that every look is bounded.
 */
#include "prelude.h"

#include "storage/shmem.h"
#include "utils/guc.h"

#include "local/table.h"

/*
 * Defines the table's size setting; only when preloaded, since only then is
 * there a table.
 */
void
table_init(SharedTable *table, bool preloaded)
{
	if (!preloaded)
		return;
	DefineCustomIntVariable(table->setting, table->description, NULL, &table->size, table->size,
							table->size_min, table->size_max, PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* Slots per partition (0: none), at least a key's probes. */
static int
slots_per_partition(const SharedTable *table)
{
	return table->size == 0 ? 0 :
		Max((table->size + table->partitions - 1) / table->partitions, table->probes);
}

/* Shared memory the table needs: its header, then its slots, each on its own cache lines. */
Size
table_shmem_size(const SharedTable *table)
{
	return add_size(CACHELINEALIGN(table->header_size),
					CACHELINEALIGN(mul_size(table->slot_size,
											mul_size(slots_per_partition(table),
													 table->partitions))));
}

/* Asks for the partitions' locks; called from the shmem request hook. */
void
table_shmem_request(const SharedTable *table)
{
	RequestNamedLWLockTranche(table->name, table->partitions);
}

/* Attaches to (or creates, with empty slots) the table; called with AddinShmemInitLock held. */
void
table_shmem_init(SharedTable *table)
{
	bool		found;
	int			count;

	table->slots_per_partition = slots_per_partition(table);
	count = table->slots_per_partition * table->partitions;
	table->header = ShmemInitStruct(table->name, Max(table_shmem_size(table), 1), &found);
	table->slots = (char *) table->header + CACHELINEALIGN(table->header_size);
	if (!found)
	{
		memset(table->header, 0, table_shmem_size(table));
		if (table->header_init != NULL)
			table->header_init(table->header);
		for (int i = 0; table->slot_init != NULL && i < count; i++)
			table->slot_init(table->slots + i * table->slot_size);
	}
	table->locks = GetNamedLWLockTranche(table->name);
}

/* True when the table exists: preloaded, with slots. */
bool
table_available(const SharedTable *table)
{
	return table->header != NULL && table->slots_per_partition > 0;
}

/* Locks key's partition in mode; returns it, for table_unlock. */
int
table_lock(const SharedTable *table, const LocalKey *key, LWLockMode mode)
{
	int			partition = key->hash % table->partitions;

	LWLockAcquire(&table->locks[partition].lock, mode);
	return partition;
}

void
table_unlock(const SharedTable *table, int partition)
{
	LWLockRelease(&table->locks[partition].lock);
}

/* The slot at index of partition. */
void *
table_slot(const SharedTable *table, int partition, int index)
{
	return table->slots +
		((Size) partition * table->slots_per_partition + index) * table->slot_size;
}

/* Key's i-th probe. */
static LocalKey *
probe(const SharedTable *table, const LocalKey *key, int i)
{
	int			partition = key->hash % table->partitions;
	int			start = (key->hash / table->partitions) % table->slots_per_partition;

	return table_slot(table, partition, (start + i) % table->slots_per_partition);
}

/* Key's slot, or NULL; its partition locked. */
void *
table_find(const SharedTable *table, const LocalKey *key)
{
	for (int i = 0; i < table->probes; i++)
	{
		LocalKey   *slot = probe(table, key, i);

		if (slot->hash == key->hash && slot->check == key->check)
			return slot;
	}
	return NULL;
}

/*
 * Key's slot, with its partition locked exclusively: its own, else an empty
 * probe, else the probe that evictable allows with the lowest rank (the
 * rule sees every taken probe before an empty one, so it may also learn
 * from those it keeps); NULL when none may give way. *how says how: a
 * slot given to key now has its key set, the rest as the last user left it.
 */
void *
table_claim(const SharedTable *table, const LocalKey *key, TableEvictable evictable, void *arg,
			TableClaim *how)
{
	LocalKey   *chosen = table_find(table, key);
	int64		lowest = PG_INT64_MAX;

	*how = TABLE_FOUND;
	if (chosen != NULL)
		return chosen;
	*how = TABLE_EVICTED;
	for (int i = 0; i < table->probes; i++)
	{
		LocalKey   *slot = probe(table, key, i);
		int64		rank;

		if (slot->hash == 0)
		{
			chosen = slot;
			*how = TABLE_WAS_EMPTY;
			break;
		}
		if (evictable(slot, arg, &rank) && (chosen == NULL || rank < lowest))
		{
			chosen = slot;
			lowest = rank;
		}
	}
	if (chosen != NULL)
		*chosen = *key;
	return chosen;
}

/* Slots in all (0 without a table). */
int
table_size(const SharedTable *table)
{
	return table->header == NULL ? 0 : table->slots_per_partition * table->partitions;
}
