/*
 * policy.c
 *	  The per-backend cache of rl_policy rows.
 *
 * A decision must not run SQL, so each backend keeps the policies in a hash
 * table. The table's statement trigger sends a relcache invalidation for
 * rl_policy on commit; our callback only marks the cache stale and the next
 * lookup reloads it (the pattern pg_cron uses). The reload reads the table
 * directly, so a role that may only call rl_consume needs no SELECT on it.
 */
#include "ratelimit.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
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

static HTAB *policy_cache = NULL;
static MemoryContext policy_cache_context = NULL;
static bool policy_cache_valid = false;
static Oid	policy_relid = InvalidOid;

/* Marks the cache stale when rl_policy changes (or on a full cache reset). */
static void
policy_invalidate_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == policy_relid)
		policy_cache_valid = false;
}

/* Registers the invalidation callback; called once per backend from _PG_init. */
void
policy_cache_init(void)
{
	CacheRegisterRelcacheCallback(policy_invalidate_callback, (Datum) 0);
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

/* Index in a deformed row of rl_policy of the column called column. */
static AttrNumber
policy_attnum(Relation rel, const char *column)
{
	AttrNumber	attnum = get_attnum(RelationGetRelid(rel), column);

	if (attnum == InvalidAttrNumber)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table rl_policy has no column \"%s\"", column),
				 errhint("Update the extension with ALTER EXTENSION ratelimit UPDATE.")));
	return attnum - 1;
}

/*
 * Reads every row of rl_policy (locked by the caller) into a new cache, which
 * replaces the old one only once it is complete. A row outside the bounds
 * (possible only if someone dropped the table's constraints) is kept marked
 * unusable, so that it fails its own decisions and no others.
 */
static void
policy_cache_load(Oid relid)
{
	MemoryContext context;
	HASHCTL		hashctl = {0};
	HTAB	   *cache;
	Relation	rel;
	TupleDesc	desc;
	Snapshot	snapshot;
	TableScanDesc scan;
	HeapTuple	tuple;
	int			name_col,
				algorithm_col,
				capacity_col,
				refill_amount_col,
				refill_period_col,
				idle_ttl_col,
				fail_mode_col,
				mode_col,
				local_share_col,
				version_col;

	/* Under the transaction's context until complete, so that an error frees it. */
	context = AllocSetContextCreate(CurrentMemoryContext, "ratelimit policies",
									ALLOCSET_SMALL_SIZES);
	hashctl.keysize = NAMEDATALEN;
	hashctl.entrysize = sizeof(Policy);
	hashctl.hcxt = context;
	cache = hash_create("ratelimit policies", 64, &hashctl,
						HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

	rel = table_open(relid, NoLock);
	desc = RelationGetDescr(rel);
	name_col = policy_attnum(rel, "name");
	algorithm_col = policy_attnum(rel, "algorithm");
	capacity_col = policy_attnum(rel, "capacity");
	refill_amount_col = policy_attnum(rel, "refill_amount");
	refill_period_col = policy_attnum(rel, "refill_period");
	idle_ttl_col = policy_attnum(rel, "idle_ttl");
	fail_mode_col = policy_attnum(rel, "fail_mode");
	mode_col = policy_attnum(rel, "mode");
	local_share_col = policy_attnum(rel, "local_share");
	version_col = policy_attnum(rel, "version");

	/* The latest snapshot: a change is seen from the moment it commits. */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Datum	   *values = palloc(desc->natts * sizeof(Datum));
		bool	   *nulls = palloc(desc->natts * sizeof(bool));
		char	   *name;
		char	   *fail_mode;
		char	   *algorithm;
		Policy	   *policy;
		bool		found;
		int64		idle_ttl_ms;
		int64		capacity;
		int64		refill_amount;
		int64		period_ms;
		double		share;

		heap_deform_tuple(tuple, desc, values, nulls);
		name = TextDatumGetCString(values[name_col]);
		policy = hash_search(cache, name, HASH_ENTER, &found);
		policy->version = DatumGetInt32(values[version_col]);
		fail_mode = TextDatumGetCString(values[fail_mode_col]);
		policy->fail_mode = parse_fail_mode(fail_mode);
		{
			char	   *mode = TextDatumGetCString(values[mode_col]);

			policy->mode = strcmp(mode, "shadow") == 0 ? POLICY_MODE_SHADOW :
				strcmp(mode, "disabled") == 0 ? POLICY_MODE_DISABLED : POLICY_MODE_ENFORCE;
			pfree(mode);
		}
		idle_ttl_ms = nulls[idle_ttl_col] ? 0 :
			interval_ms(DatumGetIntervalP(values[idle_ttl_col]));
		capacity = DatumGetInt64(values[capacity_col]);
		algorithm = TextDatumGetCString(values[algorithm_col]);
		policy->algorithm = strcmp(algorithm, "concurrency") == 0 ?
			ALGORITHM_CONCURRENCY : ALGORITHM_TOKEN_BUCKET;
		pfree(algorithm);
		if (policy->algorithm == ALGORITHM_CONCURRENCY)
		{
			/* Leases: capacity at once, each living at most idle_ttl. */
			memset(&policy->bucket, 0, sizeof(policy->bucket));
			policy->bucket.capacity = capacity;
			policy->bucket.ttl_ms = idle_ttl_ms;
			policy->usable = capacity > 0 && idle_ttl_ms > 0;
			policy->local_usable = false;
		}
		else
		{
			refill_amount = nulls[refill_amount_col] ? 0 : DatumGetInt64(values[refill_amount_col]);
			period_ms = nulls[refill_period_col] ? 0 :
				interval_ms(DatumGetIntervalP(values[refill_period_col]));
			policy->usable = bucket_params_init(&policy->bucket, capacity, refill_amount,
												period_ms, idle_ttl_ms);

			/*
			 * The local bucket holds local_share of the capacity (at least one
			 * token) and refills local_share as fast, by a period stretched and
			 * rounded up: rounding never gives more than the share.
			 */
			share = DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
													   values[local_share_col]));
			policy->local_usable = share >= 0.000001 && share <= 1 &&
				period_ms / share < (double) BUCKET_EXACT_LIMIT &&
				bucket_params_init(&policy->local_bucket,
								   Max((int64) floor(capacity * share), 1), refill_amount,
								   (int64) ceil(period_ms / share), 0);
		}
		pfree(fail_mode);
		pfree(name);
		pfree(values);
		pfree(nulls);
	}
	table_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, NoLock);

	MemoryContextSetParent(context, CacheMemoryContext);
	if (policy_cache_context != NULL)
		MemoryContextDelete(policy_cache_context);
	policy_cache_context = context;
	policy_cache = cache;
}

/*
 * Locks rl_policy for reading without letting a transaction that holds it
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
					 errmsg("could not read the rate limit policies: table rl_policy is locked"),
					 errdetail("Another transaction holds a lock on rl_policy that blocks reading it, as TRUNCATE and ALTER TABLE do.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 5, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return true;
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

	if (!policy_cache_valid)
	{
		Oid			relid = get_relname_relid("rl_policy", get_func_namespace(function_oid));

		if (!OidIsValid(relid))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("table rl_policy of extension ratelimit does not exist")));
		policy_relid = relid;
		if (policy_cache_lock(relid))
		{
			/* Set first: an invalidation that arrives during the load marks it stale again. */
			policy_cache_valid = true;
			PG_TRY();
			{
				policy_cache_load(relid);
			}
			PG_CATCH();
			{
				policy_cache_valid = false;
				PG_RE_THROW();
			}
			PG_END_TRY();
			UnlockRelationOid(relid, AccessShareLock);
		}
	}

	if (strlen(name) >= NAMEDATALEN)
		return NULL;
	return hash_search(policy_cache, name, HASH_FIND, NULL);
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
	PG_RETURN_POINTER(NULL);
}
