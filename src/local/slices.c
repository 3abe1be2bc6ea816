/*
 * slices.c
 *	  Slices of hot subjects' tokens held by this server, in shared memory:
 *	  the table behind allowances (engine/allowance.c says when to use it).
 *
 * A slot per subject holds at most one slice: tokens taken from the
 * subject's bucket in Redis by one call, granted here one take at a time
 * until they are spent or the slice's time is up. What is left then is
 * handed out to be given back to Redis, by the take that finds it (its own
 * subject's next fetch, or any fetch of this database that sweeps the same
 * partition). At most one fetch of a new slice is under way per subject, so
 * that a server never holds more than one slice of it: meanwhile the other
 * backends wait for it (a condition variable per partition, for at most the
 * fetch's own deadline) and take from the new slice, or ask Redis for their
 * cost alone (a batch, which never fetches nor waits). A fetch ends with its
 * install or abandon, on an error too, and at its backend's exit at the
 * latest; one lost some other way is over at its deadline.
 *
 * A slot also counts the tokens granted here to its subject in the current
 * and the previous period of allowance_ttl: a subject is hot once it was
 * granted something in them, and a new slice is that much and the cost (at
 * most the allowance), so that a slice grows with what the subject really
 * asks of this server and a subject asked once in a while parks nothing.
 *
 * A slot's key is the local buckets' hash of database, policy, version,
 * installation and subject with its keyed check (local/keys.c), so a slice
 * is never granted to a subject it was not taken for.
 *
 * The table (local/table.c) has ratelimit.allowance_size slots; when a
 * subject's probes are all taken, the least asked of those holding no live
 * slice and no fetch gives way.
 * Takes from a live slice hold the lock shared (the slice's tokens and the
 * demand are atomics); everything else holds it exclusively. Losing a slot
 * or its slice (a crash, a restart) only loses tokens.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#include "local/slices.h"
#include "local/table.h"

#define SLICE_PARTITIONS 16
/* The longest a fetch is waited for, whatever its deadline (a lost one's backend ended without a reply). */
#define SLICE_FETCH_STALE_MS 10000
/* Slots a fetch looks at for expired slices to give back. */
#define SLICE_SWEEP 32

typedef struct SliceSlot
{
	LocalKey	key;			/* first, as local/table.c wants it */
	Oid			database;
	uint32		ticket;			/* the fetch of a new slice under way (0: none) */
	uint32		dropped;		/* a fetch whose slice rl_reset made void */
	int			fetch_pid;		/* who fetches */
	int64		fetch_ms;		/* since when */
	int64		fetch_until_ms; /* when it has failed, if it has not ended (its deadline) */
	/*
	 * Tokens left in the slice (0: none) and granted here since period_ms:
	 * takes from the slice change them under the shared lock (a slice's hot
	 * path does not serialise its backends); all else holds it exclusively.
	 */
	pg_atomic_uint64 left;
	pg_atomic_uint64 used;
	SliceGrant	slice;			/* the slice's other numbers (its left field unused) */
	SliceGiveBack origin;		/* where the slice came from (its tokens field unused) */
	int64		period_ms;
	int64		used_before;	/* tokens granted here in the period before */
	/* Until then no fetch, nor a wait for one: the last found the bucket short. */
	int64		starved_until_ms;
} SliceSlot;

/* What the partitions share besides their slots. */
typedef struct SliceShared
{
	pg_atomic_uint32 tickets;
	int			sweep[SLICE_PARTITIONS];	/* where each partition's next sweep starts */
	ConditionVariable fetched[SLICE_PARTITIONS];	/* a fetch of the partition ended */
} SliceShared;

static void slot_init(void *slot);
static void header_init(void *header);

SharedTable slices_table = {
	.name = "ratelimit slices",
	.slot_size = sizeof(SliceSlot),
	.slot_init = slot_init,
	.partitions = SLICE_PARTITIONS,
	.probes = 4,
	.setting = "ratelimit.allowance_size",
	.description = "Slots for slices of hot subjects' tokens in shared memory (0: no allowances).",
	.size = 1000,
	.size_min = 0,
	.size_max = 1000 * 1000,
	.header_size = sizeof(SliceShared),
	.header_init = header_init,
};
static bool exit_callback = false;

/* What the partitions share: the table's header. */
static SliceShared *
shared(void)
{
	return slices_table.header;
}

static void
header_init(void *header)
{
	SliceShared *made = header;

	pg_atomic_init_u32(&made->tickets, 0);
	for (int i = 0; i < SLICE_PARTITIONS; i++)
		ConditionVariableInit(&made->fetched[i]);
}

/* Empties slot, keeping its key (an empty slot's is 0). */
static void
slot_clear(SliceSlot *slot)
{
	LocalKey	key = slot->key;

	memset(slot, 0, sizeof(*slot));
	pg_atomic_init_u64(&slot->left, 0);
	pg_atomic_init_u64(&slot->used, 0);
	slot->key = key;
}

/* An empty slot. */
static void
slot_init(void *slot)
{
	slot_clear(slot);
	((SliceSlot *) slot)->key.hash = 0;
}

/* True when this server can hold slices: preloaded, with slots. */
bool
slices_available(void)
{
	return table_available(&slices_table);
}

/*
 * True when slot's fetch is under way: begun, and its deadline not passed (a
 * fetch whose backend was lost is over then). Clocks read just before the
 * lock may be a little behind fetch_ms: a fetch that began
 * SLICE_FETCH_STALE_MS ahead of now (a clock stepped back) is over too.
 */
static bool
fetching(const SliceSlot *slot, int64 now_ms)
{
	return slot->ticket != 0 && now_ms < slot->fetch_until_ms &&
		slot->fetch_ms - now_ms < SLICE_FETCH_STALE_MS;
}

/* True when slot's slice may grant at now_ms (a window's: within its window). */
static bool
live(SliceSlot *slot, int64 now_ms)
{
	return pg_atomic_read_u64(&slot->left) > 0 && now_ms >= slot->slice.usable_from_ms &&
		now_ms < slot->slice.usable_until_ms;
}

/* Starts a new period of demand when allowance_ttl has passed since the last one began. */
static void
rotate(SliceSlot *slot, int64 now_ms, int64 ttl_ms)
{
	if (now_ms - slot->period_ms < ttl_ms)
		return;
	slot->used_before = now_ms - slot->period_ms < 2 * ttl_ms ? pg_atomic_read_u64(&slot->used) : 0;
	pg_atomic_write_u64(&slot->used, 0);
	slot->period_ms = now_ms;
}

/*
 * Empties slot's slice; what it held goes to backs, to be given back, while
 * its tokens still count where they were taken (a window's until its end)
 * and there is room. Tokens not handed out are lost, never granted.
 */
static void
hand_back(SliceSlot *slot, int64 now_ms, SliceGiveBack *backs, int *nbacks)
{
	int64		left = pg_atomic_exchange_u64(&slot->left, 0);

	if (left > 0 && now_ms < slot->slice.givable_until_ms &&
		slot->database == MyDatabaseId && *nbacks < SLICE_MAX_GIVEBACKS)
	{
		backs[*nbacks] = slot->origin;
		backs[*nbacks].tokens = left;
		(*nbacks)++;
	}
}

/* Tokens granted here lately: the current period's and the one before. */
static int64
demand_of(SliceSlot *slot)
{
	return pg_atomic_read_u64(&slot->used) + slot->used_before;
}

/* The eviction rule: a slot holding no live slice and no fetch gives way, the least asked first. */
static bool
idle(void *slot, void *arg, int64 *rank)
{
	const SliceAsk *ask = arg;

	*rank = demand_of(slot);
	return !live(slot, ask->now_ms) && !fetching(slot, ask->now_ms);
}

/*
 * A new slot for ask's subject, with its partition locked exclusively: an
 * empty one, else one that idle lets go (its slice handed back); NULL when
 * every probe is busy.
 */
static SliceSlot *
claim(const SliceAsk *ask, SliceGiveBack *backs, int *nbacks)
{
	TableClaim	how;
	SliceSlot  *chosen = table_claim(&slices_table, &ask->key, idle, (void *) ask, &how);

	if (chosen == NULL)
		return NULL;
	if (how == TABLE_EVICTED)
		hand_back(chosen, ask->now_ms, backs, nbacks);
	slot_clear(chosen);
	chosen->database = MyDatabaseId;
	chosen->period_ms = ask->now_ms;
	return chosen;
}

/*
 * Hands back, while there is room in backs, the expired slices of this
 * database among the next SLICE_SWEEP slots of the partition (each sweep
 * goes on where the last one ended).
 */
static void
sweep(int partition, int64 now_ms, SliceGiveBack *backs, int *nbacks)
{
	int			n = Min(SLICE_SWEEP, slices_table.slots_per_partition);

	for (int i = 0; i < n && *nbacks < SLICE_MAX_GIVEBACKS; i++)
	{
		SliceSlot  *other = table_slot(&slices_table, partition, shared()->sweep[partition]);

		shared()->sweep[partition] = (shared()->sweep[partition] + 1) % slices_table.slots_per_partition;
		if (other->key.hash != 0 && other->database == MyDatabaseId &&
			pg_atomic_read_u64(&other->left) > 0 && !live(other, now_ms) &&
			!fetching(other, now_ms))
			hand_back(other, now_ms, backs, nbacks);
	}
}

/*
 * True when slot's slice came from a bucket of ask's limits (its key, of the
 * same subject, policy and version, is not compared: a slice taken before the
 * key prefix changed is granted until its time is up).
 */
static bool
same_origin(SliceSlot *slot, const SliceAsk *ask)
{
	return memcmp(&slot->origin.params, ask->params, sizeof(LimitParams)) == 0;
}

/*
 * Takes ask->cost from slot's live slice (of ask's limits), with the slot's
 * lock held in either mode: true, with the slice after it in grant, when it
 * held that much. (The demand's period moves on only under the exclusive
 * lock: until then, grants count in the current one.)
 */
static bool
take_from(SliceSlot *slot, const SliceAsk *ask, SliceGrant *grant)
{
	uint64		left;

	if (!live(slot, ask->now_ms) || !same_origin(slot, ask))
		return false;
	left = pg_atomic_read_u64(&slot->left);
	do
	{
		if (left < (uint64) ask->cost)
			return false;
	} while (!pg_atomic_compare_exchange_u64(&slot->left, &left, left - ask->cost));
	pg_atomic_fetch_add_u64(&slot->used, ask->cost);
	*grant = slot->slice;
	grant->left = left - ask->cost;
	return true;
}

/* True while slot's subject was found short of tokens lately (see starved_until_ms). */
static bool
starved(const SliceSlot *slot, const SliceAsk *ask)
{
	return ask->now_ms < slot->starved_until_ms;
}

/*
 * The hot path: true, with the slice after it in grant, when the subject's
 * live slice grants ask. Else *alone says whether the take is to ask Redis
 * for its cost alone without coming back to the table (the subject is
 * starved: see starved_until_ms).
 */
bool
slices_grant(const SliceAsk *ask, SliceGrant *grant, bool *alone)
{
	int			partition = table_lock(&slices_table, &ask->key, LW_SHARED);
	SliceSlot  *slot = table_find(&slices_table, &ask->key);
	bool		granted = slot != NULL && take_from(slot, ask, grant);

	*alone = !granted && slot != NULL && starved(slot, ask);
	table_unlock(&slices_table, partition);
	return granted;
}

/* Ends every fetch this backend has under way (it is exiting). */
static void
abandon_mine(int code, Datum arg)
{
	for (int partition = 0; partition < SLICE_PARTITIONS; partition++)
	{
		LWLockAcquire(&slices_table.locks[partition].lock, LW_EXCLUSIVE);
		for (int i = 0; i < slices_table.slots_per_partition; i++)
		{
			SliceSlot  *slot = table_slot(&slices_table, partition, i);

			if (slot->ticket != 0 && slot->fetch_pid == MyProcPid)
				slot->ticket = 0;
		}
		LWLockRelease(&slices_table.locks[partition].lock);
		ConditionVariableBroadcast(&shared()->fetched[partition]);
	}
}

/*
 * One take of ask->cost for its subject, after slices_grant: granted from a
 * slice that came meanwhile (SLICE_GRANTED, grant filled), or a new slice to
 * fetch (SLICE_FETCH: *want tokens at most, under *ticket, which no other
 * backend fetches meanwhile; the subject's own slice, spent too far or
 * expired, and some expired ones of the partition go to backs, to be given
 * back first), or another backend's fetch to wait for (SLICE_WAIT, under
 * *ticket), or Redis to ask for the cost alone (SLICE_NONE: a cold subject,
 * or a cost no slice would serve; a live slice is kept for the takes it
 * can serve).
 */
SliceOutcome
slices_take(const SliceAsk *ask, SliceGrant *grant, uint32 *ticket, int64 *want,
			SliceGiveBack *backs, int *nbacks)
{
	int			partition;
	SliceSlot  *slot;
	SliceOutcome outcome = SLICE_NONE;
	int64		now_ms = ask->now_ms;

	*nbacks = 0;
	partition = table_lock(&slices_table, &ask->key, LW_EXCLUSIVE);
	slot = table_find(&slices_table, &ask->key);
	if (slot == NULL)
		(void) claim(ask, backs, nbacks);
	else if (take_from(slot, ask, grant))
		outcome = SLICE_GRANTED;
	else if (starved(slot, ask))
		outcome = SLICE_NONE;
	else if (fetching(slot, now_ms))
	{
		*ticket = slot->ticket;
		outcome = SLICE_WAIT;
	}
	else
	{
		int64		demand;

		rotate(slot, now_ms, ask->ttl_ms);
		demand = demand_of(slot);
		*want = Min(Min(ask->allowance, ask->params->capacity), demand + ask->cost);
		if (demand > 0 && *want > ask->cost && ask->may_fetch)
		{
			uint32		next;

			hand_back(slot, now_ms, backs, nbacks);
			sweep(partition, now_ms, backs, nbacks);
			do
				next = pg_atomic_add_fetch_u32(&shared()->tickets, 1);
			while (next == 0);
			slot->ticket = *ticket = next;
			slot->fetch_pid = MyProcPid;
			slot->fetch_ms = now_ms;
			slot->fetch_until_ms = now_ms + Min(Max(ask->fetch_ms, 1), SLICE_FETCH_STALE_MS);
			outcome = SLICE_FETCH;
		}
		else if (!live(slot, now_ms) || !same_origin(slot, ask))
			hand_back(slot, now_ms, backs, nbacks);
	}
	table_unlock(&slices_table, partition);
	if (outcome == SLICE_FETCH && !exit_callback)
	{
		before_shmem_exit(abandon_mine, (Datum) 0);
		exit_callback = true;
	}
	return outcome;
}

/*
 * Installs the slice fetched under ticket (what is left after the fetching
 * take's cost), taken at taken_ms; starved_until_ms, when not 0, is until
 * when the subject starves (the bucket held less than the fetch asked for).
 * SLICE_MOVED_ON when the slot has moved on
 * (another fetch took over, or the slot went to another subject): the caller
 * gives it back; SLICE_DROPPED when rl_reset made it void meanwhile.
 */
SliceInstall
slices_install(const SliceAsk *ask, uint32 ticket, int64 taken_ms, const SliceGrant *slice,
			   int64 starved_until_ms)
{
	int			partition = table_lock(&slices_table, &ask->key, LW_EXCLUSIVE);
	SliceSlot  *slot = table_find(&slices_table, &ask->key);
	SliceInstall result = SLICE_MOVED_ON;

	if (slot != NULL && slot->dropped == ticket)
		result = SLICE_DROPPED;
	else if (slot != NULL && slot->ticket == ticket)
	{
		slot->ticket = 0;
		slot->slice = *slice;
		slot->slice.left = 0;
		pg_atomic_write_u64(&slot->left, slice->left);
		slot->origin.params = *ask->params;
		strlcpy(slot->origin.key, ask->redis_key, SLICE_KEY_LEN);
		slot->origin.taken_ms = taken_ms;
		slot->origin.tokens = 0;
		rotate(slot, ask->now_ms, ask->ttl_ms);
		pg_atomic_fetch_add_u64(&slot->used, ask->cost);
		slot->starved_until_ms = starved_until_ms;
		result = SLICE_INSTALLED;
	}
	table_unlock(&slices_table, partition);
	ConditionVariableBroadcast(&shared()->fetched[partition]);
	return result;
}

/*
 * Ends ask's fetch under ticket without a slice (Redis denied, failed, or the
 * call was cancelled); starved_until_ms, when not 0, is until when the
 * subject starves (Redis denied the fetch).
 */
void
slices_abandon(const SliceAsk *ask, uint32 ticket, int64 starved_until_ms)
{
	int			partition = table_lock(&slices_table, &ask->key, LW_EXCLUSIVE);
	SliceSlot  *slot = table_find(&slices_table, &ask->key);

	if (slot != NULL && slot->ticket == ticket)
	{
		slot->ticket = 0;
		if (starved_until_ms != 0)
			slot->starved_until_ms = starved_until_ms;
	}
	table_unlock(&slices_table, partition);
	ConditionVariableBroadcast(&shared()->fetched[partition]);
}

/*
 * Waits, at most timeout_ms from now_ms (this server's clock, which the
 * fetch's time is on), until the fetch under ticket of key's slice has ended
 * or is stale. Interrupts are served while waiting (a cancel ends it).
 */
void
slices_wait(const LocalKey *key, uint32 ticket, int64 now_ms, int timeout_ms)
{
	int			partition = key->hash % SLICE_PARTITIONS;
	TimestampTz started = GetCurrentTimestamp();

	ConditionVariablePrepareToSleep(&shared()->fetched[partition]);
	for (;;)
	{
		SliceSlot  *slot;
		bool		under_way;
		int64		elapsed = TimestampDifferenceMilliseconds(started, GetCurrentTimestamp());
		int64		left = timeout_ms - elapsed;

		(void) table_lock(&slices_table, key, LW_SHARED);
		slot = table_find(&slices_table, key);
		under_way = slot != NULL && slot->ticket == ticket;
		/* A fetch is waited for until its own deadline, no longer (a lost one's too). */
		if (under_way)
			left = Min(left, slot->fetch_until_ms - now_ms - elapsed);
		table_unlock(&slices_table, partition);
		if (!under_way || left <= 0 ||
			ConditionVariableTimedSleep(&shared()->fetched[partition], (long) left, PG_WAIT_EXTENSION))
			break;
	}
	ConditionVariableCancelSleep();
}

/* Counts ask's cost, granted by Redis alone, in its subject's demand. */
void
slices_note(const SliceAsk *ask)
{
	int			partition = table_lock(&slices_table, &ask->key, LW_EXCLUSIVE);
	SliceSlot  *slot = table_find(&slices_table, &ask->key);

	if (slot != NULL)
	{
		rotate(slot, ask->now_ms, ask->ttl_ms);
		pg_atomic_fetch_add_u64(&slot->used, ask->cost);
	}
	table_unlock(&slices_table, partition);
}

/*
 * Drops key's slice without giving it back, and the slice of a fetch under
 * way too (rl_reset made here: the bucket it came from is full again, so its
 * tokens would be granted twice).
 */
void
slices_forget(const LocalKey *key)
{
	int			partition;
	SliceSlot  *slot;

	if (!slices_available())
		return;
	partition = table_lock(&slices_table, key, LW_EXCLUSIVE);
	slot = table_find(&slices_table, key);
	if (slot != NULL)
	{
		pg_atomic_write_u64(&slot->left, 0);
		if (slot->ticket != 0)
			slot->dropped = slot->ticket;
		slot->ticket = 0;
		slot->starved_until_ms = 0;	/* the bucket is full again */
	}
	table_unlock(&slices_table, partition);
	ConditionVariableBroadcast(&shared()->fetched[partition]);
}
