/*
 * policy.c
 *	  The per-backend cache of rl_policy and rl_override rows.
 *
 * A decision must not run SQL, so each backend keeps the policies and their
 * per-subject overrides in hash tables. Each table's statement trigger sends a
 * relcache invalidation on commit; our callback only marks the cache stale and
 * the next lookup reloads both tables (the pattern pg_cron uses). The reload
 * reads the tables directly, so a role that may only call rl_consume needs no
 * SELECT on them.
 */
#include "ratelimit.h"

#include "access/heapam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "port/atomics.h"
#include "storage/shmem.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include <math.h>

#include "commands/trigger.h"
#include "datatype/timestamp.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "policy.h"

/*
 * One override, found by a hash of (policy, subject) in override_cache; the
 * rare overrides whose hashes collide are chained.
 */
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

static HTAB *policy_cache = NULL;
static Oid	installation_relid = InvalidOid;

/*
 * With shared memory: the generation of rl_policy and rl_override (of every
 * database), bumped by each commit that changed them once it is visible. The
 * cache remembers the generation it was loaded at.
 */
static pg_atomic_uint64 *shared_generation = NULL;
static uint64 loaded_generation = 0;
static bool generation_known = false;
/* This transaction changed rl_policy or rl_override: its commit bumps the generation. */
static bool policies_changed = false;
/*
 * The rows a restore inserted with their own versions while the history was
 * still empty, in this transaction (rl_history_restored); NULL when none.
 */
static HTAB *restored_rows = NULL;
/* A cache reset (not an invalidation of our tables) arrived: the generation says if it matters. */
static bool policy_cache_reset = false;
static HTAB *override_cache = NULL;	/* NULL while the extension has no rl_override */
static HTAB *override_versions = NULL;	/* the 'limit' overrides by version */
static MemoryContext policy_cache_context = NULL;
static bool policy_cache_valid = false;
static Oid	policy_relid = InvalidOid;
static Oid	override_relid = InvalidOid;

static void apply_limits(Policy *policy, const Override *override);

/*
 * Marks the cache stale when rl_policy or rl_override changes. A reset of all
 * caches (InvalidOid: this backend missed invalidations, which any role can
 * cause by creating and dropping temporary tables in a loop) only marks it to
 * be checked: the tables' generation says whether they changed.
 */
static void
policy_invalidate_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid)
		policy_cache_reset = true;
	else if (relid == policy_relid || relid == override_relid)
		policy_cache_valid = false;
}

/*
 * The first column (a bigint) of the one row of relid (locked by the caller),
 * read with snapshot: the last_value of a sequence. -1 when there is none.
 */
static int64
read_single_bigint(Oid relid, Snapshot snapshot)
{
	Relation	rel = table_open(relid, NoLock);
	TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);
	HeapTuple	tuple = heap_getnext(scan, ForwardScanDirection);
	int64		value = -1;
	bool		isnull;

	if (tuple != NULL)
	{
		Datum		datum = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull);

		if (!isnull)
			value = DatumGetInt64(datum);
	}
	table_endscan(scan);
	table_close(rel, NoLock);
	return value;
}

/*
 * After a cache reset: true when rl_policy and rl_override have not changed
 * since the cache was loaded (the generation is the same), so the cache
 * still holds. Without shared memory, and on a standby (whose changes come
 * by replay, where no trigger runs), it cannot tell: the cache is reloaded.
 */
static bool
policy_generation_unchanged(void)
{
	if (shared_generation == NULL || !generation_known || RecoveryInProgress())
		return false;
	return pg_atomic_read_u64(shared_generation) == loaded_generation;
}

/* Shared memory the generation needs when preloaded. */
Size
policy_shmem_size(void)
{
	return MAXALIGN(sizeof(pg_atomic_uint64));
}

/* Attaches to (or creates) the generation; called with AddinShmemInitLock held. */
void
policy_shmem_init(void)
{
	bool		found;

	shared_generation = ShmemInitStruct("ratelimit policy generation",
										sizeof(pg_atomic_uint64), &found);
	if (!found)
		pg_atomic_init_u64(shared_generation, 0);
}

/*
 * A transaction that changed rl_policy or rl_override bumps the generation
 * when it commits: after its changes are visible (so that a cache loaded
 * before the bump reloads at the next reset) and before its invalidations
 * are sent. A prepared one bumps it at COMMIT PREPARED (policy_prepared_committed).
 */
static void
policy_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (policies_changed && shared_generation != NULL)
				pg_atomic_fetch_add_u64(shared_generation, 1);
			policies_changed = false;
			restored_rows = NULL;	/* it lived in the transaction's memory */
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			policies_changed = false;
			restored_rows = NULL;
			break;
		default:
			break;
	}
}

/* COMMIT PREPARED ran: it may have committed a change of the policies. */
void
policy_prepared_committed(void)
{
	if (shared_generation != NULL)
		pg_atomic_fetch_add_u64(shared_generation, 1);
}

/* Registers the invalidation callback; called once per backend from _PG_init. */
void
policy_cache_init(void)
{
	CacheRegisterRelcacheCallback(policy_invalidate_callback, (Datum) 0);
	RegisterXactCallback(policy_xact_callback, NULL);
}

/* Milliseconds in an interval the table's constraints accepted (no months, whole ms). */
static int64
interval_ms(Interval *interval)
{
	return (int64) interval->day * SECS_PER_DAY * 1000 + interval->time / 1000;
}

/* Parses the fail_mode column; the table's constraint allows no other values. */
static FailMode
parse_fail_mode(const char *text)
{
	if (strcmp(text, "open") == 0)
		return FAIL_MODE_OPEN;
	if (strcmp(text, "local") == 0)
		return FAIL_MODE_LOCAL;
	return FAIL_MODE_CLOSED;
}

/* The fail mode's name as the table spells it. */
const char *
policy_fail_mode_name(FailMode mode)
{
	switch (mode)
	{
		case FAIL_MODE_OPEN:
			return "open";
		case FAIL_MODE_LOCAL:
			return "local";
		case FAIL_MODE_CLOSED:
			break;
	}
	return "closed";
}

/* Index in a deformed row of rel of the column called column. */
static AttrNumber
policy_attnum(Relation rel, const char *column)
{
	AttrNumber	attnum = get_attnum(RelationGetRelid(rel), column);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table %s has no column \"%s\"", RelationGetRelationName(rel), column),
				 errhint("Update the extension with ALTER EXTENSION ratelimit UPDATE.")));
	return attnum - 1;
}

/*
 * Sets policy's local fallback bucket for a bucket of capacity, refilling
 * refill_amount per period_ms: local_share of the capacity (at least one
 * token), refilling local_share as fast by a period stretched and rounded up,
 * so that rounding never gives more than the share.
 */
static void
policy_local_bucket(Policy *policy, int64 capacity, int64 refill_amount, int64 period_ms)
{
	double		share = policy->local_share;

	policy->local_usable = share >= 0.000001 && share <= 1 &&
		period_ms / share < (double) BUCKET_EXACT_LIMIT &&
		bucket_params_init(&policy->local_bucket,
						   Max((int64) floor(capacity * share), 1), refill_amount,
						   (int64) ceil(period_ms / share), 0);
}

/*
 * Reads every row of rl_policy (locked by the caller) into cache. A row outside
 * the bounds (possible only if someone dropped the table's constraints) is kept
 * marked unusable, so that it fails its own decisions and no others.
 */
static void
load_policies(HTAB *cache, Oid relid, Snapshot snapshot, uint64 installation)
{
	Relation	rel = table_open(relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	int			name_col = policy_attnum(rel, "name"),
				algorithm_col = policy_attnum(rel, "algorithm"),
				capacity_col = policy_attnum(rel, "capacity"),
				refill_amount_col = policy_attnum(rel, "refill_amount"),
				refill_period_col = policy_attnum(rel, "refill_period"),
				idle_ttl_col = policy_attnum(rel, "idle_ttl"),
				fail_mode_col = policy_attnum(rel, "fail_mode"),
				mode_col = policy_attnum(rel, "mode"),
				local_share_col = policy_attnum(rel, "local_share"),
				version_col = policy_attnum(rel, "version");
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	TableScanDesc scan = table_beginscan(rel, snapshot, 0, NULL);
	HeapTuple	tuple;

	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		char	   *name;
		char	   *word;
		Policy	   *policy;
		int64		capacity;
		int64		refill_amount;
		int64		period_ms;

		heap_deform_tuple(tuple, desc, values, nulls);
		name = TextDatumGetCString(values[name_col]);
		policy = hash_search(cache, name, HASH_ENTER, NULL);
		policy->version = DatumGetInt32(values[version_col]);
		policy->installation = installation;
		word = TextDatumGetCString(values[fail_mode_col]);
		policy->fail_mode = parse_fail_mode(word);
		word = TextDatumGetCString(values[mode_col]);
		policy->mode = strcmp(word, "shadow") == 0 ? POLICY_MODE_SHADOW :
			strcmp(word, "disabled") == 0 ? POLICY_MODE_DISABLED : POLICY_MODE_ENFORCE;
		word = TextDatumGetCString(values[algorithm_col]);
		policy->algorithm = strcmp(word, "concurrency") == 0 ?
			ALGORITHM_CONCURRENCY : ALGORITHM_TOKEN_BUCKET;
		policy->idle_ttl_ms = nulls[idle_ttl_col] ? 0 :
			interval_ms(DatumGetIntervalP(values[idle_ttl_col]));
		policy->local_share = DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
																 values[local_share_col]));
		policy->override = OVERRIDE_NONE;
		capacity = DatumGetInt64(values[capacity_col]);
		if (policy->algorithm == ALGORITHM_CONCURRENCY)
		{
			/* Leases: capacity at once, each living at most idle_ttl. */
			memset(&policy->bucket, 0, sizeof(policy->bucket));
			policy->bucket.capacity = capacity;
			policy->bucket.ttl_ms = policy->idle_ttl_ms;
			/* Lease expiries (now + TTL) and counts must stay exact in the script's doubles. */
			policy->usable = capacity > 0 && capacity < BUCKET_EXACT_LIMIT &&
				policy->idle_ttl_ms > 0 && policy->idle_ttl_ms <= BUCKET_MAX_TTL_MS;
			policy->local_usable = false;
		}
		else
		{
			refill_amount = nulls[refill_amount_col] ? 0 : DatumGetInt64(values[refill_amount_col]);
			period_ms = nulls[refill_period_col] ? 0 :
				interval_ms(DatumGetIntervalP(values[refill_period_col]));
			policy->usable = bucket_params_init(&policy->bucket, capacity, refill_amount,
												period_ms, policy->idle_ttl_ms);
			policy_local_bucket(policy, capacity, refill_amount, period_ms);
		}
	}
	table_endscan(scan);
	table_close(rel, NoLock);
}

/* The hash key of (policy, subject) in override_cache. */
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
	int64		now_ms = rl_epoch_ms(GetCurrentTimestamp());
	Relation	rel = table_open(relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	int			policy_col = policy_attnum(rel, "policy"),
				subject_col = policy_attnum(rel, "subject"),
				action_col = policy_attnum(rel, "action"),
				capacity_col = policy_attnum(rel, "capacity"),
				refill_amount_col = policy_attnum(rel, "refill_amount"),
				refill_period_col = policy_attnum(rel, "refill_period"),
				expires_at_col = policy_attnum(rel, "expires_at"),
				version_col = policy_attnum(rel, "version");
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
			rl_epoch_ms(DatumGetTimestampTz(values[expires_at_col]));
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
			interval_ms(DatumGetIntervalP(values[refill_period_col]));

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
 * Locks relid for reading without letting a transaction that holds it
 * exclusively (TRUNCATE, ALTER TABLE) stall decisions. Returns false at once
 * when an older cache exists: the locker's change is not committed yet, so that
 * cache may serve until the next call tries again. Without a cache, waits at
 * most command_timeout.
 */
static bool
policy_cache_lock(Oid relid)
{
	int64		deadline = rl_monotonic_us() + (int64) rl_command_timeout_ms * 1000;

	while (!ConditionalLockRelationOid(relid, AccessShareLock))
	{
		if (policy_cache != NULL)
			return false;
		if (rl_monotonic_us() >= deadline)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not read the rate limit policies: table %s is locked",
							get_rel_name(relid)),
					 errdetail("Another transaction holds a lock on it that blocks reading it, as TRUNCATE and ALTER TABLE do.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 5, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return true;
}

/*
 * Reads rl_policy and rl_override (if the installed version has it) into a new
 * cache, which replaces the old one only once it is complete. Keeps the old
 * one when a table is locked (see policy_cache_lock).
 */
static void
policy_cache_load(void)
{
	MemoryContext context;
	HASHCTL		hashctl = {0};
	HTAB	   *policies;
	HTAB	   *volatile overrides = NULL;
	HTAB	   *volatile versions = NULL;
	Snapshot	snapshot;
	int64		installation;

	if (!policy_cache_lock(policy_relid))
		return;
	if (OidIsValid(override_relid) && !policy_cache_lock(override_relid))
	{
		UnlockRelationOid(policy_relid, AccessShareLock);
		return;
	}
	/* Without the installation id every key would be another installation's. */
	if (OidIsValid(installation_relid) && !policy_cache_lock(installation_relid))
	{
		if (OidIsValid(override_relid))
			UnlockRelationOid(override_relid, AccessShareLock);
		UnlockRelationOid(policy_relid, AccessShareLock);
		return;
	}
	/* Set first: an invalidation that arrives during the load marks it stale again. */
	policy_cache_valid = true;
	/* Read before the snapshot: a change that commits after this can only make the cache reload again. */
	generation_known = shared_generation != NULL;
	loaded_generation = generation_known ? pg_atomic_read_u64(shared_generation) : 0;

	/* Under the transaction's context until complete, so that an error frees it. */
	context = AllocSetContextCreate(CurrentMemoryContext, "ratelimit policies",
									ALLOCSET_SMALL_SIZES);
	hashctl.keysize = NAMEDATALEN;
	hashctl.entrysize = sizeof(Policy);
	hashctl.hcxt = context;
	policies = hash_create("ratelimit policies", 64, &hashctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	/* The latest snapshot: a change is seen from the moment it commits. */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	PG_TRY();
	{
		installation = OidIsValid(installation_relid) ?
			read_single_bigint(installation_relid, snapshot) : 0;
		if (installation < 0)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the installation id of extension ratelimit cannot be read"),
					 errhint("Restore rl_installation_seq from a dump, or create the extension again.")));
		load_policies(policies, policy_relid, snapshot, (uint64) installation);
		if (OidIsValid(override_relid))
		{
			hashctl.keysize = sizeof(uint64);
			hashctl.entrysize = sizeof(OverrideEntry);
			overrides = hash_create("ratelimit overrides", 64, &hashctl,
									HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
			hashctl.keysize = sizeof(int32);
			hashctl.entrysize = sizeof(OverrideVersion);
			versions = hash_create("ratelimit override versions", 64, &hashctl,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
			load_overrides(overrides, versions, context, override_relid, snapshot);
		}
	}
	PG_CATCH();
	{
		policy_cache_valid = false;
		PG_RE_THROW();
	}
	PG_END_TRY();
	UnregisterSnapshot(snapshot);
	if (OidIsValid(installation_relid))
		UnlockRelationOid(installation_relid, AccessShareLock);
	if (OidIsValid(override_relid))
		UnlockRelationOid(override_relid, AccessShareLock);
	UnlockRelationOid(policy_relid, AccessShareLock);

	MemoryContextSetParent(context, CacheMemoryContext);
	if (policy_cache_context != NULL)
		MemoryContextDelete(policy_cache_context);
	policy_cache_context = context;
	policy_cache = policies;
	override_cache = overrides;
	override_versions = versions;
}

/*
 * Returns the policy called name, or NULL if there is none. function_oid is
 * the calling SQL function: rl_policy lives in the same schema.
 */
const Policy *
policy_lookup(Oid function_oid, const char *name)
{
	/* Cheap when nothing is pending; lets a long transaction see committed changes. */
	AcceptInvalidationMessages();

	if (policy_cache_reset && policy_cache_valid)
	{
		policy_cache_reset = false;
		if (!policy_generation_unchanged())
			policy_cache_valid = false;
	}
	if (!policy_cache_valid)
	{
		Oid			namespace = get_func_namespace(function_oid);

		policy_relid = get_relname_relid("rl_policy", namespace);
		if (!OidIsValid(policy_relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table rl_policy of extension ratelimit does not exist")));
		/* Version 0.1.0 of the extension has no overrides, versions before 0.4.0 none of these. */
		override_relid = get_relname_relid("rl_override", namespace);
		installation_relid = get_relname_relid("rl_installation_seq", namespace);
		policy_cache_reset = false;
		policy_cache_load();
	}

	if (strlen(name) >= NAMEDATALEN)
		return NULL;
	return hash_search(policy_cache, name, HASH_FIND, NULL);
}

/*
 * Applies the subject's override, if it has one that has not expired (rl_now_ms),
 * to policy (a request's copy of a cached policy): other limits and a version
 * of their own, or a fixed answer (decision_fixed).
 */
void
policy_apply_override(Policy *policy, const char *subject, int length)
{
	OverrideEntry *entry;
	const Override *override;
	uint64		hash;
	int64		now_ms;

	if (override_cache == NULL || hash_get_num_entries(override_cache) == 0)
		return;
	hash = override_hash(policy->name, subject, length);
	entry = hash_search(override_cache, &hash, HASH_FIND, NULL);
	for (override = entry ? entry->first : NULL; override != NULL; override = override->next)
		if (override->length == length && memcmp(override->subject, subject, length) == 0 &&
			strcmp(override->policy, policy->name) == 0)
			break;
	if (override == NULL)
		return;
	now_ms = rl_now_ms();
	if (override->expires_ms != 0 && override->expires_ms <= now_ms)
		return;

	policy->override = override->action;
	if (override->action == OVERRIDE_DENY)
		/* Until it expires; one that never does says a day. */
		policy->override_retry_ms = override->expires_ms != 0 ?
			override->expires_ms - now_ms : (int64) SECS_PER_DAY * 1000;
	if (override->action == OVERRIDE_LIMIT)
		apply_limits(policy, override);
}

/*
 * Copies into out the limits that decisions of policy name at version are made
 * under: the policy's, or those of its 'limit' override with that version.
 * False when neither has that version (any more). function_oid is the calling
 * SQL function: rl_policy lives in the same schema.
 */
bool
policy_limits(Oid function_oid, const char *name, int32 version, Policy *out)
{
	const Policy *policy = policy_lookup(function_oid, name);
	const OverrideVersion *entry;

	if (policy == NULL)
		return false;
	*out = *policy;
	if (policy->version == version)
		return true;
	entry = override_versions == NULL ? NULL :
		hash_search(override_versions, &version, HASH_FIND, NULL);
	if (entry == NULL || strcmp(entry->override->policy, name) != 0)
		return false;
	out->override = OVERRIDE_LIMIT;
	apply_limits(out, entry->override);
	return true;
}

/* Gives policy (a copy) the limits and the version of a 'limit' override. */
static void
apply_limits(Policy *policy, const Override *override)
{
	int64		capacity;

	policy->version = override->version;
	capacity = override->capacity;
	if (policy->algorithm == ALGORITHM_CONCURRENCY)
	{
		policy->bucket.capacity = capacity;
		return;
	}
	/* The policy's idle_ttl when it is long enough for these limits, else their refill time. */
	if (!bucket_params_init(&policy->bucket, capacity, override->refill_amount,
							override->period_ms, policy->idle_ttl_ms))
		policy->usable = bucket_params_init(&policy->bucket, capacity, override->refill_amount,
											override->period_ms, 0);
	policy_local_bucket(policy, capacity, override->refill_amount, override->period_ms);
}

/* One row key of restored_rows: "object:name:subject:version". */
typedef struct RestoredRow
{
	char		key[NAMEDATALEN * 2 + RL_SUBJECT_MAX_BYTES + 32];
} RestoredRow;

PG_FUNCTION_INFO_V1(rl_history_restored);

/*
 * rl_history_restored(key, mark): for the history triggers. With mark, notes
 * that a row with key was inserted by a restore (rl_inserted_version kept its
 * version while the history was empty) and returns true; without, returns
 * whether that row was noted, and forgets it. A row of the restore is then
 * not recorded again: the restored history holds it. Noted rows live until
 * the transaction ends.
 */
Datum
rl_history_restored(PG_FUNCTION_ARGS)
{
	text	   *key = PG_GETARG_TEXT_PP(0);
	bool		mark = PG_GETARG_BOOL(1);
	RestoredRow probe = {{0}};
	bool		found;

	text_to_cstring_buffer(key, probe.key, sizeof(probe.key));
	if (restored_rows == NULL)
	{
		HASHCTL		hashctl = {0};

		if (!mark)
			PG_RETURN_BOOL(false);
		hashctl.keysize = sizeof(probe.key);
		hashctl.entrysize = sizeof(RestoredRow);
		hashctl.hcxt = TopTransactionContext;
		restored_rows = hash_create("ratelimit restored rows", 64, &hashctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	(void) hash_search(restored_rows, probe.key, mark ? HASH_ENTER : HASH_REMOVE, &found);
	PG_RETURN_BOOL(mark || found);
}

PG_FUNCTION_INFO_V1(rl_policy_invalidate);

/* Statement trigger on rl_policy: every backend drops its cache once this commits. */
Datum
rl_policy_invalidate(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("rl_policy_invalidate must be called as a trigger")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	policies_changed = true;
	PG_RETURN_POINTER(NULL);
}
