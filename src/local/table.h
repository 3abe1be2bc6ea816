/*
 * table.h
 *	  A table of fixed-size slots in shared memory, in partitions with a lock
 *	  each, where a key's slot is one of a few probes from its placing hash:
 *	  the shape the local buckets, the deny cache and the slices share.
 */
#ifndef RL_LOCAL_TABLE_H
#define RL_LOCAL_TABLE_H

#include "storage/lwlock.h"

#include "local/keys.h"

/*
 * One table: what its user says (name, slot size, partitions, probes), and
 * where it is once attached. Every slot begins with its LocalKey (hash 0:
 * empty); the rest is the user's.
 */
typedef struct SharedTable
{
	const char *name;			/* of its shared memory and its locks */
	Size		slot_size;
	void		(*slot_init) (void *slot);	/* an empty slot (NULL: all zeros) */
	int			partitions;
	int			probes;
	/* The server-start setting of its size in slots, its default, bounds and doc. */
	const char *setting;
	const char *description;
	int			size;
	int			size_min;
	int			size_max;
	/* What the user keeps beside the slots (0: nothing), made by header_init (NULL: zeros). */
	Size		header_size;
	void		(*header_init) (void *header);
	/* Set by table_shmem_init. */
	int			slots_per_partition;	/* 0: no table (not preloaded, or sized 0) */
	void	   *header;
	char	   *slots;
	LWLockPadded *locks;
} SharedTable;

/*
 * An eviction rule: true when slot may give way to another key, with rank
 * (the lowest gives way first); arg is the caller's.
 */
typedef bool (*TableEvictable) (void *slot, void *arg, int64 *rank);

/* How table_claim found a key's slot. */
typedef enum TableClaim
{
	TABLE_FOUND,				/* the key's own */
	TABLE_WAS_EMPTY,			/* given to it now: an empty slot */
	TABLE_EVICTED				/* given to it now: another key's, by the eviction rule */
} TableClaim;

extern void table_init(SharedTable *table, bool preloaded);
extern Size table_shmem_size(const SharedTable *table);
extern void table_shmem_request(const SharedTable *table);
extern void table_shmem_init(SharedTable *table);
extern bool table_available(const SharedTable *table);
extern int	table_lock(const SharedTable *table, const LocalKey *key, LWLockMode mode);
extern void table_unlock(const SharedTable *table, int partition);
extern void *table_find(const SharedTable *table, const LocalKey *key);
extern void *table_claim(const SharedTable *table, const LocalKey *key, TableEvictable evictable,
						 void *arg, TableClaim *how);
extern int	table_size(const SharedTable *table);
extern void *table_slot(const SharedTable *table, int partition, int index);

#endif							/* RL_LOCAL_TABLE_H */
