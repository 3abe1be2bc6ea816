/*
 * top.c
 *	  rl_top: the subjects of a policy most denied and most served lately, in
 *	  shared memory, per server.
 *
 * Each (database, policy) that decides gets a summary, up to ratelimit.top_policies
 * of them; when all are taken, a new policy takes the summary of one that has not
 * decided for two periods (its summary is empty), else it is not summarised. A summary keeps, for each kind (denials,
 * tokens taken), ratelimit.top_size counters: the space-saving algorithm (Metwally,
 * Agrawal and El Abbadi, 2005). A subject already counted adds its weight; a new one
 * takes a free counter, else the smallest, whose count it inherits as its error. So
 * the counts add up to the weight N seen, the smallest is at most N / size, each count
 * overstates its subject's weight by at most its error (<= N / size), and a subject
 * missing has a weight of at most N / size. Two halves count alternate periods of
 * ratelimit.top_period: rl_top adds the last whole period to the current one.
 *
 * Subjects are identities: a summary keeps the subject's first TOP_SUBJECT_BYTES
 * bytes, which rl_top (functions/monitoring.c) shows only to roles that may read
 * rl_override (where subjects are kept anyway); others get its keyed hash
 * (rl_subject_hash), as the decision log does. Never in a metric or a log line.
 */
#include "prelude.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/siphash.h"
#include "observe/top.h"
#include "policy/subject.h"

/* Bytes of a subject a summary keeps (a longer one keeps its keyed hash too). */
#define TOP_SUBJECT_BYTES 128
/* Hex digits of a keyed hash (policy/subject.c's subject_hash). */
#define TOP_HASH_CHARS 32

typedef enum TopKind
{
	TOP_DENIED,					/* 1 per denial */
	TOP_TAKEN,					/* the cost of each grant that took tokens */
	TOP_KINDS
} TopKind;

static const char *const top_kind_names[TOP_KINDS] = {"denied", "taken"};

static bool track_top = true;
static int	top_size = 32;
static int	top_policies = 64;
static int	top_period_ms = 60 * 1000;

/* One counter: a subject (by its 64-bit keyed id), its count and error. */
typedef struct TopItem
{
	uint64		id;
	int64		count;
	int64		error;
	int			length;			/* the subject's length (it may be longer than kept) */
	char		subject[TOP_SUBJECT_BYTES];
	char		hash[TOP_HASH_CHARS + 1];	/* a subject longer than kept: its keyed hash */
} TopItem;

typedef struct TopKey
{
	Oid			database;
	char		policy[NAMEDATALEN];
} TopKey;

/* One policy's summary: items[half][kind][top_size]. */
typedef struct TopBlock
{
	TopKey		key;			/* whose it is (a block idle for two periods is given to another) */
	int64		period;			/* the number of the period the current half counts */
	int64		total[2][TOP_KINDS];	/* the weight each half has counted */
	int			used[2][TOP_KINDS];
	TopItem		items[FLEXIBLE_ARRAY_MEMBER];
} TopBlock;

typedef struct TopEntry
{
	TopKey		key;
	int			block;			/* its TopBlock and its lock (+1) */
} TopEntry;

typedef struct TopShared
{
	uint64		secret[2];		/* keys the ids: a subject's id is unguessable */
	int			nblocks;
	LWLockPadded *locks;		/* [0] guards the hash, [1 + i] block i */
} TopShared;

static TopShared *top_shared = NULL;
static HTAB *top_hash = NULL;
static char *top_blocks = NULL;

static void top_rotate(TopBlock *block, int64 now_ms);

static Size
block_size(void)
{
	return MAXALIGN(offsetof(TopBlock, items) + (Size) 2 * TOP_KINDS * top_size * sizeof(TopItem));
}

static TopBlock *
block_at(int i)
{
	return (TopBlock *) (top_blocks + (Size) i * block_size());
}

static TopItem *
items_of(TopBlock *block, int half, TopKind kind)
{
	return &block->items[((Size) half * TOP_KINDS + kind) * top_size];
}

/*
 * Defines ratelimit.track_top and ratelimit.top_period, and when preloading
 * ratelimit.top_size and ratelimit.top_policies, which size the summaries.
 */
void
top_init(bool preloaded)
{
	DefineCustomBoolVariable("ratelimit.track_top",
							 "Count each policy's most denied and most served subjects for rl_top (needs shared_preload_libraries).",
							 NULL, &track_top, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratelimit.top_period",
							"How long each half of an rl_top summary counts: rl_top shows the last one or two.",
							NULL, &top_period_ms, 60 * 1000, 1000, 24 * 60 * 60 * 1000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	if (!preloaded)
		return;
	DefineCustomIntVariable("ratelimit.top_size",
							"Counters per policy and kind in rl_top's summaries (0: none); a count's error is at most the weight seen / this.",
							NULL, &top_size, 32, 0, 4096,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ratelimit.top_policies",
							"Policies (of all databases together) that rl_top summarises; later ones are not.",
							NULL, &top_policies, 64, 1, 100 * 1000,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

/* Shared memory for the summaries, requested from _PG_init's hook. */
Size
top_shmem_size(void)
{
	if (top_size == 0)
		return 0;
	return add_size(add_size(MAXALIGN(sizeof(TopShared)),
							 hash_estimate_size(top_policies, sizeof(TopEntry))),
					mul_size(top_policies, block_size()));
}

void
top_shmem_request(void)
{
	if (top_size > 0)
		RequestNamedLWLockTranche("ratelimit top", top_policies + 1);
}

/* Creates or attaches to the summaries; called with AddinShmemInitLock held. */
void
top_shmem_init(void)
{
	HASHCTL		hashctl = {0};
	bool		found;

	if (top_size == 0)
		return;
	top_shared = ShmemInitStruct("ratelimit top", sizeof(TopShared), &found);
	hashctl.keysize = sizeof(TopKey);
	hashctl.entrysize = sizeof(TopEntry);
	top_hash = ShmemInitHash("ratelimit top entries", top_policies, top_policies, &hashctl,
							 HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	top_blocks = ShmemInitStruct("ratelimit top blocks", mul_size(top_policies, block_size()),
								 &found);
	if (!found)
	{
		if (!pg_strong_random(top_shared->secret, sizeof(top_shared->secret)))
			elog(FATAL, "ratelimit: could not generate a random key for its shared memory");
		top_shared->nblocks = 0;
		top_shared->locks = GetNamedLWLockTranche("ratelimit top");
		memset(top_blocks, 0, mul_size(top_policies, block_size()));
	}
}

/*
 * A block for key: a new one while there are; else one whose policy has not
 * decided for two whole periods (its summary is empty), taken from it; -1
 * when none is. Called with the hash's lock held exclusively.
 */
static int
top_block_new(const TopKey *key, int64 now_ms)
{
	int64		period = now_ms / top_period_ms;

	if (top_shared->nblocks < top_policies)
	{
		TopBlock   *block = block_at(top_shared->nblocks);

		block->key = *key;
		block->period = period;
		return top_shared->nblocks++;
	}
	for (int i = 0; i < top_shared->nblocks; i++)
	{
		TopBlock   *block = block_at(i);
		LWLock	   *lock = &top_shared->locks[1 + i].lock;
		bool		idle;

		LWLockAcquire(lock, LW_EXCLUSIVE);
		idle = block->period < period - 1 || block->period > period;
		if (idle)
		{
			hash_search(top_hash, &block->key, HASH_REMOVE, NULL);
			block->key = *key;
			block->period = period - 2;
			top_rotate(block, now_ms);
		}
		LWLockRelease(lock);
		if (idle)
			return i;
	}
	return -1;
}

/*
 * The block of policy in this database, made on its first decision (the
 * caller checks, under the block's lock, that it is still the policy's);
 * -1 when none is left.
 */
static int
top_block(const char *policy, int64 now_ms)
{
	TopKey		key = {.database = MyDatabaseId};
	TopEntry   *entry;
	bool		found;
	int			index = -1;

	strlcpy(key.policy, policy, sizeof(key.policy));
	LWLockAcquire(&top_shared->locks[0].lock, LW_SHARED);
	entry = hash_search(top_hash, &key, HASH_FIND, NULL);
	if (entry != NULL)
		index = entry->block;
	LWLockRelease(&top_shared->locks[0].lock);
	if (index >= 0)
		return index;
	LWLockAcquire(&top_shared->locks[0].lock, LW_EXCLUSIVE);
	entry = hash_search(top_hash, &key, HASH_FIND, NULL);
	if (entry != NULL)
		index = entry->block;
	else if ((index = top_block_new(&key, now_ms)) >= 0)
	{
		entry = hash_search(top_hash, &key, HASH_ENTER_NULL, &found);
		if (entry == NULL)
			index = -1;			/* cannot happen: the hash holds a key per block */
		else
			entry->block = index;
	}
	LWLockRelease(&top_shared->locks[0].lock);
	return index;
}

/* This backend's idea of where each policy's summary is (checked under its lock). */
typedef struct TopLocal
{
	char		policy[NAMEDATALEN];	/* hash key */
	int			block;			/* -1: none was left */
	int64		period;			/* when it was looked up */
} TopLocal;

static HTAB *top_local = NULL;

/*
 * The block of policy as this backend last found it, looked up again when
 * asked to (again: it was given away) or when none was left a period ago (a
 * look may scan every block: not on every decision); -1 for none.
 */
static int
top_local_block(const char *policy, int64 now_ms, bool again)
{
	/* Most calls decide the policy the last one did: no hashing then. */
	static TopLocal *last = NULL;
	TopLocal   *local;
	bool		found;

	if (last != NULL && !again && last->block >= 0 && strcmp(last->policy, policy) == 0)
		return last->block;
	if (top_local == NULL)
	{
		HASHCTL		hashctl = {0};

		hashctl.keysize = NAMEDATALEN;
		hashctl.entrysize = sizeof(TopLocal);
		hashctl.hcxt = TopMemoryContext;
		top_local = hash_create("ratelimit top blocks", 64, &hashctl,
								HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	local = hash_search(top_local, policy, HASH_ENTER, &found);
	if (!found || again || (local->block < 0 && local->period != now_ms / top_period_ms))
	{
		local->block = top_block(policy, now_ms);
		local->period = now_ms / top_period_ms;
	}
	last = local;
	return local->block;
}

/* True when block is (still) the summary of policy in this database. */
static bool
top_owns(const TopBlock *block, const char *policy)
{
	return block->key.database == MyDatabaseId && strcmp(block->key.policy, policy) == 0;
}

/* Starts the period of now_ms in block: a half older than the last period is cleared. */
static void
top_rotate(TopBlock *block, int64 now_ms)
{
	int64		period = now_ms / top_period_ms;

	if (period == block->period)
		return;
	for (int half = 0; half < 2; half++)
	{
		/* The half of the period just over stays; any other is cleared. */
		if (period == block->period + 1 && half == (int) (block->period % 2))
			continue;
		for (int kind = 0; kind < TOP_KINDS; kind++)
		{
			block->total[half][kind] = 0;
			block->used[half][kind] = 0;
		}
	}
	block->period = period;
}

/* Adds weight to the subject (id) in one kind's counters of a half (space-saving). */
static void
top_add(TopBlock *block, int half, TopKind kind, const TopItem *subject, int64 weight)
{
	TopItem    *items = items_of(block, half, kind);
	int			used = block->used[half][kind];
	int			smallest = 0;

	block->total[half][kind] += weight;
	for (int i = 0; i < used; i++)
	{
		if (items[i].id == subject->id)
		{
			items[i].count += weight;
			return;
		}
		if (items[i].count < items[smallest].count)
			smallest = i;
	}
	if (used < top_size)
	{
		items[used] = *subject;
		items[used].count = weight;
		items[used].error = 0;
		block->used[half][kind]++;
		return;
	}
	{
		int64		inherited = items[smallest].count;

		items[smallest] = *subject;
		items[smallest].count = inherited + weight;
		items[smallest].error = inherited;
	}
}

/*
 * Counts one decision of subject in its policy's summary: a denial (by the
 * policy, not by an outage) or the tokens a grant took.
 */
void
top_decision(const Decision *decision, int64 cost, const char *subject, int length)
{
	DecisionSource source = decision->source == DECISION_SOURCE_SHADOW ?
		decision->origin : decision->source;
	bool		denied = !decision->allowed || decision->source == DECISION_SOURCE_SHADOW;
	TopItem		item;
	SipHash		hash;
	int			index;
	TopBlock   *block;
	int64		now_ms;

	if (top_shared == NULL || !track_top || subject == NULL)
		return;
	if (denied ? !(source == DECISION_SOURCE_REDIS || source == DECISION_SOURCE_DENY_CACHE ||
				   source == DECISION_SOURCE_LOCAL) :
		!(source == DECISION_SOURCE_REDIS || source == DECISION_SOURCE_LOCAL ||
		  source == DECISION_SOURCE_ALLOWANCE))
		return;
	siphash_init(&hash, top_shared->secret);
	siphash_update(&hash, subject, length);
	item.id = siphash_final(&hash);
	item.length = length;
	memcpy(item.subject, subject, Min(length, TOP_SUBJECT_BYTES));
	item.hash[0] = '\0';
	if (length > TOP_SUBJECT_BYTES)
	{
		/* Hashed here, outside the lock (subject_hash may raise): long subjects are rare. */
		StringInfoData text;

		initStringInfo(&text);
		subject_hash(&text, subject, length);
		strlcpy(item.hash, text.data, sizeof(item.hash));
		pfree(text.data);
	}
	now_ms = clock_now_ms();
	for (int tries = 0; tries < 2; tries++)
	{
		index = top_local_block(decision->policy, now_ms, tries > 0);
		if (index < 0)
			return;
		block = block_at(index);
		LWLockAcquire(&top_shared->locks[1 + index].lock, LW_EXCLUSIVE);
		if (top_owns(block, decision->policy))
		{
			top_rotate(block, now_ms);
			top_add(block, (int) (block->period % 2), denied ? TOP_DENIED : TOP_TAKEN, &item,
					denied ? 1 : cost);
			LWLockRelease(&top_shared->locks[1 + index].lock);
			return;
		}
		/* Given to another policy since this backend looked: look again. */
		LWLockRelease(&top_shared->locks[1 + index].lock);
	}
}

/* A subject's merged count and error over both halves. */
typedef struct Ranked
{
	const TopItem *item;
	int64		count;
	int64		error;
} Ranked;

static int
row_order(const void *a, const void *b)
{
	const Ranked *x = a;
	const Ranked *y = b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	return x->error < y->error ? -1 : x->error > y->error ? 1 : 0;
}

/*
 * The rows of one kind over both halves of copy: each subject counted in
 * either; where a full half lacks it, that half's smallest count is its most
 * there (added to count and error); a half not full counted all it saw.
 */
static int
top_rank(TopBlock *copy, TopKind kind, Ranked *rows)
{
	int64		floor[2];
	int			nrows = 0;

	for (int half = 0; half < 2; half++)
	{
		TopItem    *items = items_of(copy, half, kind);
		int			used = copy->used[half][kind];

		floor[half] = 0;
		if (used == top_size)
		{
			floor[half] = items[0].count;
			for (int i = 1; i < used; i++)
				floor[half] = Min(floor[half], items[i].count);
		}
	}
	for (int half = 0; half < 2; half++)
	{
		TopItem    *items = items_of(copy, half, kind);

		for (int i = 0; i < copy->used[half][kind]; i++)
		{
			TopItem    *other = items_of(copy, 1 - half, kind);
			int			found = -1;

			for (int j = 0; j < copy->used[1 - half][kind]; j++)
				if (other[j].id == items[i].id)
					found = j;
			/* A subject in both halves is made a row once, from the first. */
			if (found >= 0 && half == 1)
				continue;
			rows[nrows].item = &items[i];
			rows[nrows].count = items[i].count + (found >= 0 ? other[found].count : floor[1 - half]);
			rows[nrows].error = items[i].error + (found >= 0 ? other[found].error : floor[1 - half]);
			nrows++;
		}
	}
	qsort(rows, nrows, sizeof(Ranked), row_order);
	return Min(nrows, top_size);
}

/*
 * The rows of rl_top for policy in this database (TopRow), for each kind
 * ('denied', 'taken') the subjects with the largest counts on this server
 * over the last one or two periods, ranked; NIL when it has no summary.
 * Raises 55000 without the summaries' shared memory.
 */
List *
top_read(const char *policy)
{
	TopKey		key = {.database = MyDatabaseId};
	TopEntry   *entry;
	int			index;
	bool		owned;
	TopBlock   *copy;
	Ranked	   *ranked;
	List	   *out = NIL;

	if (top_shared == NULL)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("rl_top needs ratelimit in shared_preload_libraries and ratelimit.top_size above 0"),
				 errhint("Add ratelimit to shared_preload_libraries (and give ratelimit.top_size counters), then restart the server.")));
	strlcpy(key.policy, policy, sizeof(key.policy));
	LWLockAcquire(&top_shared->locks[0].lock, LW_SHARED);
	entry = hash_search(top_hash, &key, HASH_FIND, NULL);
	index = entry != NULL ? entry->block : -1;
	LWLockRelease(&top_shared->locks[0].lock);
	if (index < 0)
		return NIL;
	copy = palloc(block_size());
	LWLockAcquire(&top_shared->locks[1 + index].lock, LW_EXCLUSIVE);
	owned = top_owns(block_at(index), policy);
	if (owned)
	{
		top_rotate(block_at(index), clock_now_ms());
		memcpy(copy, block_at(index), block_size());
	}
	LWLockRelease(&top_shared->locks[1 + index].lock);
	if (!owned)
		return NIL;

	ranked = palloc(2 * top_size * sizeof(Ranked));
	for (int kind = 0; kind < TOP_KINDS; kind++)
	{
		int			nrows = top_rank(copy, kind, ranked);

		for (int i = 0; i < nrows; i++)
		{
			const TopItem *item = ranked[i].item;
			TopRow	   *row = palloc(sizeof(TopRow));
			StringInfoData hash;

			initStringInfo(&hash);
			if (item->hash[0] != '\0')
				appendStringInfoString(&hash, item->hash);
			else
				subject_hash(&hash, item->subject, item->length);
			row->kind = top_kind_names[kind];
			row->rank = i + 1;
			row->length = Min(item->length, TOP_SUBJECT_BYTES);
			row->subject = pnstrdup(item->subject, row->length);
			row->hash = hash.data;
			row->count = ranked[i].count;
			row->error = ranked[i].error;
			row->total = copy->total[0][kind] + copy->total[1][kind];
			out = lappend(out, row);
		}
	}
	return out;
}
