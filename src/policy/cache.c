/*
 * cache.c
 *	  The per-backend cache of rl_policy and rl_override rows.
 *
 * A decision must not run SQL, so each backend keeps the policies and their
 * per-subject overrides in hash tables. Each table's statement trigger sends a
 * relcache invalidation on commit; our callback only marks the cache stale and
 * the next lookup reloads both tables (the pattern pg_cron uses). The reload
 * reads the tables directly, so a role that may only call rl_consume needs no
 * SELECT on them. A backend that missed invalidations (its caches were reset)
 * asks a generation in shared memory whether the tables changed at all.
 */
#include "prelude.h"

#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_class.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "base/clock.h"
#include "policy/cache.h"
#include "policy/override.h"
#include "redis/deadline.h"

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
static MemoryContext policy_cache_context = NULL;
static bool policy_cache_valid = false;
static Oid	policy_relid = InvalidOid;
static Oid	override_relid = InvalidOid;

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
	int64		deadline = clock_monotonic_us() + (int64) deadline_command_timeout_ms * 1000;

	while (!ConditionalLockRelationOid(relid, AccessShareLock))
	{
		if (policy_cache != NULL)
			return false;
		if (clock_monotonic_us() >= deadline)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_LOCK_NOT_AVAILABLE),
					 errmsg("could not read the rate limit policies: table %s is locked",
							get_rel_name(relid)),
					 errdetail("Another transaction holds a lock on it that blocks reading it, as TRUNCATE and ALTER TABLE do."),
					 errhint("Try again once that transaction ends.")));
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
	OverrideTables overrides = {0};
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
		policy_load_all(policies, policy_relid, snapshot, (uint64) installation);
		if (OidIsValid(override_relid))
			override_load(&overrides, context, override_relid, snapshot);
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
	override_use(&overrides);
}

/*
 * Returns the policy called name, or NULL if there is none. function_oid is
 * the calling SQL function: rl_policy lives in the same schema.
 */
/*
 * The relation called name in namespace if it is a member of extension (a
 * role that may create objects there must not be able to plant a look-alike
 * where an older installation has none); InvalidOid otherwise.
 */
static Oid
extension_relation(const char *name, Oid namespace, Oid extension)
{
	Oid			relid = get_relname_relid(name, namespace);

	if (!OidIsValid(relid) || getExtensionOfObject(RelationRelationId, relid) != extension)
		return InvalidOid;
	return relid;
}

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
		Oid			extension = getExtensionOfObject(ProcedureRelationId, function_oid);

		policy_relid = extension_relation("rl_policy", namespace, extension);
		if (!OidIsValid(policy_relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table rl_policy of extension ratelimit does not exist"),
					 errhint("Install the extension's objects with CREATE EXTENSION ratelimit, or ALTER EXTENSION ratelimit UPDATE.")));
		/* Version 0.1.0 of the extension has no overrides, versions before 0.4.0 none of these. */
		override_relid = extension_relation("rl_override", namespace, extension);
		installation_relid = extension_relation("rl_installation_seq", namespace, extension);
		policy_cache_reset = false;
		policy_cache_load();
	}

	if (strlen(name) >= NAMEDATALEN)
		return NULL;
	return hash_search(policy_cache, name, HASH_FIND, NULL);
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

	if (policy == NULL)
		return false;
	*out = *policy;
	if (policy->version == version)
		return true;
	return override_limits(name, version, out);
}

/*
 * Applies the subject's override, if it has one that has not expired, to
 * policy (a request's copy of a cached policy looked up just before).
 */
void
policy_apply_override(Policy *policy, const char *subject, int length)
{
	override_apply(policy, subject, length);
}

/* The transaction changed rl_policy or rl_override: its commit bumps the generation. */
void
policy_cache_changed(void)
{
	policies_changed = true;
}

/* One row key of restored_rows: "object:name:subject:version". */
typedef struct RestoredRow
{
	char		key[NAMEDATALEN * 2 + RL_SUBJECT_MAX_BYTES + 32];
} RestoredRow;

/*
 * For the history triggers: with mark, notes that a row with key was inserted
 * by a restore (its version kept while the history was empty) and returns
 * true; without, returns whether that row was noted, and forgets it. Noted
 * rows live until the transaction ends.
 */
bool
policy_restored_row(const char *key, bool mark)
{
	RestoredRow probe = {{0}};
	bool		found;

	strlcpy(probe.key, key, sizeof(probe.key));
	if (restored_rows == NULL)
	{
		HASHCTL		hashctl = {0};

		if (!mark)
			return false;
		hashctl.keysize = sizeof(probe.key);
		hashctl.entrysize = sizeof(RestoredRow);
		hashctl.hcxt = TopTransactionContext;
		restored_rows = hash_create("ratelimit restored rows", 64, &hashctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	(void) hash_search(restored_rows, probe.key, mark ? HASH_ENTER : HASH_REMOVE, &found);
	return mark || found;
}

