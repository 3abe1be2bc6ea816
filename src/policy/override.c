/*
 * override.c
 *	  The per-subject overrides of rl_override, as the policy cache keeps them.
 *
 * An override is found by a hash of (policy, subject); the rare overrides
 * whose hashes collide are chained. 'limit' overrides are also found by their
 * version, for the limits a decision with that version was made under.
 */
#include "prelude.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "base/clock.h"
#include "policy/override.h"

/* One override; those whose (policy, subject) hashes collide are chained. */
typedef struct Override
{
	char		policy[NAMEDATALEN];
	char	   *subject;
	int			length;
	OverrideAction action;
	int32		version;
	int64		capacity;
	int64		refill_amount;	/* 0: none (allow, deny, concurrency) */
	int64		period_ms;
	int64		expires_ms;		/* ms since the epoch; 0: never */
	struct Override *next;
} Override;

typedef struct OverrideEntry
{
	uint64		hash;			/* hash key */
	Override   *first;
} OverrideEntry;

typedef struct OverrideVersion
{
	int32		version;		/* hash key */
	const Override *override;
} OverrideVersion;

/* The tables the cache uses now; NULL ones: none (a version without rl_override). */
static OverrideTables current = {0};

/* The hash key of (policy, subject) in the by_subject table. */
static uint64
override_hash(const char *policy, const char *subject, int length)
{
	return hash_bytes_extended((const unsigned char *) subject, length,
							   hash_bytes_extended((const unsigned char *) policy,
												   strlen(policy), 0));
}

/*
 * Reads every row of rl_override (locked by the caller) into cache, and the
 * 'limit' ones into versions, allocated in context.
 */
static void
load_overrides(HTAB *cache, HTAB *versions, MemoryContext context, Oid relid, Snapshot snapshot)
{
	/* The server's clock, not a test clock that may move back: expired here is for good. */
	int64		now_ms = clock_epoch_ms(GetCurrentTimestamp());
	Relation	rel = table_open(relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	int			policy_col = policy_column(rel, "policy"),
				subject_col = policy_column(rel, "subject"),
				action_col = policy_column(rel, "action"),
				capacity_col = policy_column(rel, "capacity"),
				refill_amount_col = policy_column(rel, "refill_amount"),
				refill_period_col = policy_column(rel, "refill_period"),
				expires_at_col = policy_column(rel, "expires_at"),
				version_col = policy_column(rel, "version");
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);
	HeapTuple	tuple;

	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Override   *override;
		text	   *subject;
		char	   *action;
		OverrideEntry *entry;
		uint64		hash;
		bool		found;
		int64		expires_ms;

		heap_deform_tuple(tuple, desc, values, nulls);
		expires_ms = nulls[expires_at_col] ? 0 :
			clock_epoch_ms(DatumGetTimestampTz(values[expires_at_col]));
		/* One that has expired never applies again: it is not kept. */
		if (expires_ms != 0 && expires_ms <= now_ms)
			continue;

		override = MemoryContextAllocZero(context, sizeof(Override));
		override->expires_ms = expires_ms;
		text_to_cstring_buffer(DatumGetTextPP(values[policy_col]), override->policy, NAMEDATALEN);
		subject = DatumGetTextPP(values[subject_col]);
		override->length = VARSIZE_ANY_EXHDR(subject);
		override->subject = MemoryContextAlloc(context, override->length);
		memcpy(override->subject, VARDATA_ANY(subject), override->length);
		action = TextDatumGetCString(values[action_col]);
		override->action = strcmp(action, "allow") == 0 ? OVERRIDE_ALLOW :
			strcmp(action, "deny") == 0 ? OVERRIDE_DENY : OVERRIDE_LIMIT;
		override->version = DatumGetInt32(values[version_col]);
		override->capacity = nulls[capacity_col] ? 0 : DatumGetInt64(values[capacity_col]);
		override->refill_amount = nulls[refill_amount_col] ? 0 :
			DatumGetInt64(values[refill_amount_col]);
		override->period_ms = nulls[refill_period_col] ? 0 :
			policy_interval_ms(DatumGetIntervalP(values[refill_period_col]));

		hash = override_hash(override->policy, override->subject, override->length);
		entry = hash_search(cache, &hash, HASH_ENTER, &found);
		override->next = found ? entry->first : NULL;
		entry->first = override;
		if (override->action == OVERRIDE_LIMIT)
			((OverrideVersion *) hash_search(versions, &override->version, HASH_ENTER,
											 NULL))->override = override;
	}
	table_endscan(scan);
	table_close(rel, NoLock);
}

/*
 * Reads every row of rl_override (locked by the caller) with snapshot into new
 * tables, allocated in context.
 */
void
override_load(OverrideTables *tables, MemoryContext context, Oid relid, Snapshot snapshot)
{
	HASHCTL		hashctl = {0};

	hashctl.hcxt = context;
	hashctl.keysize = sizeof(uint64);
	hashctl.entrysize = sizeof(OverrideEntry);
	tables->by_subject = hash_create("ratelimit overrides", 64, &hashctl,
									 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	hashctl.keysize = sizeof(int32);
	hashctl.entrysize = sizeof(OverrideVersion);
	tables->by_version = hash_create("ratelimit override versions", 64, &hashctl,
									 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	load_overrides(tables->by_subject, tables->by_version, context, relid, snapshot);
}

/* From now on decisions use tables (a copy is kept; their memory is the cache's). */
void
override_use(const OverrideTables *tables)
{
	current = *tables;
}

/*
 * Applies the subject's override, if it has one that has not expired (clock_now_ms),
 * to policy (a request's copy of a cached policy): other limits and a version
 * of their own, or a fixed answer (decision_fixed).
 */
void
override_apply(Policy *policy, const char *subject, int length)
{
	OverrideEntry *entry;
	const Override *override;
	uint64		hash;
	int64		now_ms;

	if (current.by_subject == NULL || hash_get_num_entries(current.by_subject) == 0)
		return;
	hash = override_hash(policy->name, subject, length);
	entry = hash_search(current.by_subject, &hash, HASH_FIND, NULL);
	for (override = entry ? entry->first : NULL; override != NULL; override = override->next)
		if (override->length == length && memcmp(override->subject, subject, length) == 0 &&
			strcmp(override->policy, policy->name) == 0)
			break;
	if (override == NULL)
		return;
	now_ms = clock_now_ms();
	if (override->expires_ms != 0 && override->expires_ms <= now_ms)
		return;

	policy->override = override->action;
	if (override->action == OVERRIDE_DENY)
		/* Until it expires; one that never does says a day. */
		policy->override_retry_ms = override->expires_ms != 0 ?
			override->expires_ms - now_ms : (int64) SECS_PER_DAY * 1000;
	if (override->action == OVERRIDE_LIMIT)
		policy_apply_limits(policy, override->version, override->capacity,
							override->refill_amount, override->period_ms);
}

/*
 * Copies into out (a copy of policy name) the limits of its 'limit' override
 * with version; false when it has none with that version (any more).
 */
bool
override_limits(const char *name, int32 version, Policy *out)
{
	const OverrideVersion *entry = current.by_version == NULL ? NULL :
		hash_search(current.by_version, &version, HASH_FIND, NULL);

	if (entry == NULL || strcmp(entry->override->policy, name) != 0)
		return false;
	out->override = OVERRIDE_LIMIT;
	policy_apply_limits(out, entry->override->version, entry->override->capacity,
						entry->override->refill_amount, entry->override->period_ms);
	return true;
}
