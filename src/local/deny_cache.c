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
 * The table (local/table.c) has ratelimit.deny_cache_size slots; when a
 * subject's probes are all taken, the one whose denial ends soonest gives way. Forgetting an entry only means asking Redis again.
 */
#include "prelude.h"


#include "base/clock.h"
#include "local/deny_cache.h"
#include "local/table.h"

#define DENY_PARTITIONS 16

typedef struct DenySlot
{
	LocalKey	key;			/* first, as local/table.c wants it */
	DenyEntry	entry;
} DenySlot;

SharedTable deny_cache_table = {
	.name = "ratelimit deny cache",
	.slot_size = sizeof(DenySlot),
	.partitions = DENY_PARTITIONS,
	.probes = 4,
	.setting = "ratelimit.deny_cache_size",
	.description = "Slots for denials remembered from Redis in shared memory (0: none).",
	.size = 10000,
	.size_min = 0,
	.size_max = 10 * 1000 * 1000,
	.header_size = sizeof(int64) * DENY_PARTITIONS,
};

/* The table's header: when each partition last forgot a denial (clock_monotonic_us), under its lock. */
static int64 *
forgot_us(void)
{
	return deny_cache_table.header;
}

/* True when denials can be remembered: preloaded, with slots. */
bool
deny_cache_available(void)
{
	return table_available(&deny_cache_table);
}

/*
 * True, with the denial in entry, when key has one still holding at now_ms
 * for this cost: the same cost, or (larger) a larger one.
 */
bool
deny_cache_find(const LocalKey *key, int64 cost, bool larger, int64 now_ms, DenyEntry *entry)
{
	int			partition = table_lock(&deny_cache_table, key, LW_SHARED);
	DenySlot   *slot = table_find(&deny_cache_table, key);
	bool		found = slot != NULL && slot->entry.until_ms > now_ms &&
		(cost == slot->entry.cost || (larger && cost > slot->entry.cost));

	if (found)
		*entry = slot->entry;
	table_unlock(&deny_cache_table, partition);
	return found;
}

/* The eviction rule: the denial that ends soonest gives way (one that has ended first). */
static bool
ends_soonest(void *slot, void *arg, int64 *rank)
{
	*rank = ((DenySlot *) slot)->entry.until_ms;
	return true;
}

/*
 * Remembers a denial of key from Redis until entry->until_ms, unless a denial
 * of the partition was forgotten since asked_us (clock_monotonic_us before the
 * take was sent): a refund made here meanwhile may not be in it.
 */
void
deny_cache_remember(const LocalKey *key, const DenyEntry *entry, int64 asked_us)
{
	int			partition = table_lock(&deny_cache_table, key, LW_EXCLUSIVE);
	DenySlot   *chosen;
	TableClaim	how;

	if (forgot_us()[partition] < asked_us)
	{
		/* The latest denial of the subject is the one kept (its cost, its wait). */
		chosen = table_claim(&deny_cache_table, key, ends_soonest, NULL, &how);
		chosen->entry = *entry;
	}
	table_unlock(&deny_cache_table, partition);
}

/* Forgets key's denial (a refund or reset made here), and any in flight (see deny_cache_remember). */
void
deny_cache_forget(const LocalKey *key)
{
	int			partition = table_lock(&deny_cache_table, key, LW_EXCLUSIVE);
	DenySlot   *slot = table_find(&deny_cache_table, key);

	forgot_us()[partition] = clock_monotonic_us();
	if (slot != NULL)
		memset(slot, 0, sizeof(DenySlot));
	table_unlock(&deny_cache_table, partition);
}
