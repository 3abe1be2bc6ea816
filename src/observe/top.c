/*
 * top.c
 *	  rl_top: the subjects of a policy most denied and most served lately, in
 *	  shared memory, per server.
 *
 * Each (database, policy) that decides gets a summary (observe/summary.c: for each
 * kind, denials and tokens taken, ratelimit.top_size counters, over two alternating
 * periods of ratelimit.top_period), up to ratelimit.top_policies of them; when all
 * are taken, a new policy takes the summary of one that has not decided for two
 * periods (its summary is empty), else it is not summarised. Each summary has a lock
 * of its own; a backend keeps where each policy's summary is, checked under it.
 *
 * Subjects are identities: a summary keeps the subject's first SUMMARY_SUBJECT_BYTES
 * bytes, which rl_top (functions/monitoring.c) shows only to roles that may read
 * rl_override (where subjects are kept anyway); others get its keyed hash
 * (rl_subject_hash), as the decision log does. Never in a metric or a log line.
 */
#include "prelude.h"

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/siphash.h"
#include "observe/summary.h"
#include "observe/top.h"
#include "policy/subject.h"

static const char *const top_kind_names[SUMMARY_KINDS] = {"denied", "taken"};

static bool track_top = true;
static int	top_size = 32;
static int	top_policies = 64;
static int	top_period_ms = 60 * 1000;

typedef struct TopKey
{
	Oid			database;
	char		policy[NAMEDATALEN];
} TopKey;

/*
 * One policy's block: whose it is (a block idle for two periods is given to
 * another), then its summary.
 */
typedef struct TopBlock
{
	TopKey		key;
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

static Size
block_size(void)
{
	return MAXALIGN(sizeof(TopBlock)) + summary_size(top_size);
}

static Summary *
summary_of(TopBlock *block)
{
	return (Summary *) ((char *) block + MAXALIGN(sizeof(TopBlock)));
}

static TopBlock *
block_at(int i)
{
	return (TopBlock *) (top_blocks + (Size) i * block_size());
}

/* Moves block on to the period of now_ms. */
static void
top_rotate(TopBlock *block, int64 now_ms)
{
	summary_rotate(summary_of(block), now_ms / top_period_ms);
}

/*
 * Defines ratelimit.track_top, and when preloading ratelimit.top_size and
 * ratelimit.top_policies, which size the summaries, and ratelimit.top_period.
 */
void
top_init(bool preloaded)
{
	DefineCustomBoolVariable("ratelimit.track_top",
							 "Count each policy's most denied and most served subjects for rl_top (needs shared_preload_libraries).",
							 NULL, &track_top, true, PGC_SUSET, 0, NULL, NULL, NULL);
	if (!preloaded)
		return;
	/* Fixed at start: every backend numbers the periods alike. */
	DefineCustomIntVariable("ratelimit.top_period",
							"How long each half of an rl_top summary counts: rl_top shows the last one or two.",
							NULL, &top_period_ms, 60 * 1000, 1000, 24 * 60 * 60 * 1000,
							PGC_POSTMASTER, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("ratelimit.top_size",
							"Counters per policy and kind in rl_top's summaries (0: none); a count's error is at most the weight seen / this.",
							NULL, &top_size, 32, 0, 1024,
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
 * True when a block last moved on in block_period has counted nothing in
 * period or the one before (a clock more than a period apart counts too).
 */
static bool
top_idle(int64 block_period, int64 period)
{
	return block_period < period - 1 || block_period > period + 1;
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
		summary_of(block)->period = period;
		return top_shared->nblocks++;
	}
	for (int i = 0; i < top_shared->nblocks; i++)
	{
		TopBlock   *block = block_at(i);
		LWLock	   *lock = &top_shared->locks[1 + i].lock;
		bool		idle;

		/* Read without its lock first, a hint: only a candidate's lock is taken. */
		if (!top_idle(summary_of(block)->period, period))
			continue;
		LWLockAcquire(lock, LW_EXCLUSIVE);
		idle = top_idle(summary_of(block)->period, period);
		if (idle)
		{
			hash_search(top_hash, &block->key, HASH_REMOVE, NULL);
			block->key = *key;
			summary_of(block)->period = period - 2;
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
	SummarySubject item;
	uint64		id;
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
	id = siphash_final(&hash);
	item.length = length;
	/* Cut at a character's end: what rl_top shows is valid text. */
	item.kept = length <= SUMMARY_SUBJECT_BYTES ? length : pg_mbcliplen(subject, length, SUMMARY_SUBJECT_BYTES);
	memcpy(item.text, subject, item.kept);
	item.hash[0] = '\0';
	if (length > SUMMARY_SUBJECT_BYTES)
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
			summary_add(summary_of(block), top_size, denied ? SUMMARY_DENIED : SUMMARY_TAKEN, id,
						&item, denied ? 1 : cost);
			LWLockRelease(&top_shared->locks[1 + index].lock);
			return;
		}
		/* Given to another policy since this backend looked: look again. */
		LWLockRelease(&top_shared->locks[1 + index].lock);
	}
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
	SummaryRow *ranked;
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
	/* A copy, moved on to now: reading changes nothing (an idle policy stays idle). */
	LWLockAcquire(&top_shared->locks[1 + index].lock, LW_SHARED);
	owned = top_owns(block_at(index), policy);
	if (owned)
		memcpy(copy, block_at(index), block_size());
	LWLockRelease(&top_shared->locks[1 + index].lock);
	if (!owned)
		return NIL;
	top_rotate(copy, clock_now_ms());

	ranked = palloc(2 * top_size * sizeof(SummaryRow));
	for (int kind = 0; kind < SUMMARY_KINDS; kind++)
	{
		int			nrows = summary_rank(summary_of(copy), top_size, kind, ranked);

		for (int i = 0; i < nrows; i++)
		{
			const SummarySubject *item = ranked[i].subject;
			TopRow	   *row = palloc(sizeof(TopRow));
			StringInfoData hash;

			initStringInfo(&hash);
			if (item->hash[0] != '\0')
				appendStringInfoString(&hash, item->hash);
			else
				subject_hash(&hash, item->text, item->length);
			row->kind = top_kind_names[kind];
			row->rank = i + 1;
			row->length = item->kept;
			row->subject = pnstrdup(item->text, row->length);
			row->hash = hash.data;
			row->count = ranked[i].count;
			row->error = ranked[i].error;
			row->total = summary_of(copy)->total[0][kind] + summary_of(copy)->total[1][kind];
			out = lappend(out, row);
		}
	}
	return out;
}
