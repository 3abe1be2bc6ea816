/*
 * policy.c
 *	  A policy: its row of rl_policy read into the form decisions use, and the
 *	  limits it decides under.
 */
#include "prelude.h"

#include <math.h>

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "policy/policy.h"

/* Milliseconds in an interval the table's constraints accepted (no months, whole ms). */
int64
policy_interval_ms(Interval *interval)
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
AttrNumber
policy_column(Relation rel, const char *column)
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
void
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
void
policy_load_all(HTAB *cache, Oid relid, Snapshot snapshot, uint64 installation)
{
	Relation	rel = table_open(relid, NoLock);
	TupleDesc	desc = RelationGetDescr(rel);
	int			name_col = policy_column(rel, "name"),
				algorithm_col = policy_column(rel, "algorithm"),
				capacity_col = policy_column(rel, "capacity"),
				refill_amount_col = policy_column(rel, "refill_amount"),
				refill_period_col = policy_column(rel, "refill_period"),
				idle_ttl_col = policy_column(rel, "idle_ttl"),
				fail_mode_col = policy_column(rel, "fail_mode"),
				mode_col = policy_column(rel, "mode"),
				local_share_col = policy_column(rel, "local_share"),
				version_col = policy_column(rel, "version");
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
			policy_interval_ms(DatumGetIntervalP(values[idle_ttl_col]));
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
				policy_interval_ms(DatumGetIntervalP(values[refill_period_col]));
			policy->usable = bucket_params_init(&policy->bucket, capacity, refill_amount,
												period_ms, policy->idle_ttl_ms);
			policy_local_bucket(policy, capacity, refill_amount, period_ms);
		}
	}
	table_endscan(scan);
	table_close(rel, NoLock);
}

/*
 * Gives policy (a copy) other limits under their own version (a 'limit'
 * override's): a capacity and, for a token bucket, a refill. The policy's
 * idle_ttl is kept when it is long enough for them, else their refill time.
 */
void
policy_apply_limits(Policy *policy, int32 version, int64 capacity, int64 refill_amount,
					int64 period_ms)
{
	policy->version = version;
	if (policy->algorithm == ALGORITHM_CONCURRENCY)
	{
		policy->bucket.capacity = capacity;
		return;
	}
	if (!bucket_params_init(&policy->bucket, capacity, refill_amount, period_ms,
							policy->idle_ttl_ms))
		policy->usable = bucket_params_init(&policy->bucket, capacity, refill_amount,
											period_ms, 0);
	policy_local_bucket(policy, capacity, refill_amount, period_ms);
}
