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
 * Sets policy's local fallback bucket for limits of capacity (refilling
 * refill_amount per period_ms, or per window): local_share of the capacity
 * (at least one token), a refill local_share as fast by a period stretched
 * and rounded up, so that rounding never gives more than the share. A sliding
 * log longer than a slot holds falls back to a fixed window of its length with
 * half that share (sliding_log.c says why), none when that is not one token.
 */
static void
policy_local_bucket(Policy *policy, int64 capacity, int64 refill_amount, int64 period_ms)
{
	double		share = policy->local_share;
	int64		local_capacity = Max((int64) floor(capacity * share), 1);
	Algorithm	algorithm = policy->algorithm;
	Interval	stretched = {0};

	policy->local_usable = false;
	if (!(share >= 0.000001 && share <= 1))
		return;
	if (limit_refills(algorithm))
	{
		if (!(period_ms / share < (double) BUCKET_EXACT_LIMIT))
			return;
		stretched.time = (int64) ceil(period_ms / share) * 1000;
		policy->local_usable = limit_params_init(&policy->local_bucket, algorithm, local_capacity,
												 refill_amount, &stretched, 0, NULL);
		return;
	}
	if (algorithm == ALGORITHM_SLIDING_LOG && local_capacity > LIMIT_LOG_TOKENS)
	{
		/* Too long a log for a slot: a fixed window of half the share (sliding_log.c). */
		algorithm = ALGORITHM_FIXED_WINDOW;
		local_capacity = (int64) floor(capacity * share) / 2;
		if (local_capacity < 1)
			return;
	}
	policy->local_usable = limit_params_init(&policy->local_bucket, algorithm, local_capacity,
											 0, &policy->period, 0, policy->bucket.time_zone);
	/* A sliding log's fixed window: epoch-aligned, as the log's window is. */
	if (policy->algorithm == ALGORITHM_SLIDING_LOG)
	{
		policy->local_bucket.calendar = CALENDAR_NONE;
		policy->local_bucket.window_ms = period_ms;
		policy->local_usable &= period_ms > 0;
	}
}

/* A policy's limits: its params and local bucket, from capacity and a refill or its window. */
static void
policy_limits(Policy *policy, int64 capacity, int64 refill_amount, int64 period_ms,
			  int64 idle_ttl_ms)
{
	Interval	refill = {0};
	const Interval *period = &policy->period;
	char		zone[LIMIT_ZONE_LEN];

	strlcpy(zone, policy->bucket.time_zone[0] ? policy->bucket.time_zone : "UTC", sizeof(zone));
	if (limit_refills(policy->algorithm))
	{
		refill.time = period_ms * 1000;
		period = &refill;
	}
	policy->usable = limit_params_init(&policy->bucket, policy->algorithm, capacity,
									   refill_amount, period, idle_ttl_ms, zone);
	/*
	 * At most the capacity, so an override's smaller capacity carries at most
	 * itself; and capacity and rollover exact in the scripts (an override's
	 * capacity is bounded alone).
	 */
	if (policy->algorithm == ALGORITHM_FIXED_WINDOW)
		policy->bucket.rollover = Min(Min(policy->rollover, capacity),
									  Max(BUCKET_EXACT_LIMIT - 1 - capacity, 0));
	policy_local_bucket(policy, capacity, refill_amount, period_ms);
}

/*
 * Where each column of rl_policy is in a row of its relation: the ones every
 * version has (deform indexes), and the attribute numbers of later ones
 * (InvalidAttrNumber before the extension is updated).
 */
typedef struct PolicyColumns
{
	int			name,
				algorithm,
				capacity,
				refill_amount,
				refill_period,
				idle_ttl,
				fail_mode,
				mode,
				local_share,
				version;
	/* Added by 0.7: until the extension is updated, every zone is UTC, denials remembered. */
	AttrNumber	time_zone;
	AttrNumber	deny_cache;
	/* Added by 0.8: until then, no allowances. */
	AttrNumber	allowance;
	AttrNumber	allowance_ttl;
	/* Added by 0.10: until then, debt up to the capacity, request ids remembered an hour. */
	AttrNumber	max_debt;
	AttrNumber	replay_window;
	/* Added by 0.11: until then, every decision in this server's Redis. */
	AttrNumber	region_mode;
	AttrNumber	home_region;
	AttrNumber	region_base;
	/* Added by 0.12: until then, no rollover. */
	AttrNumber	rollover;
} PolicyColumns;

/* Finds rel's columns. */
static void
policy_columns(Relation rel, PolicyColumns *columns)
{
	columns->name = policy_column(rel, "name");
	columns->algorithm = policy_column(rel, "algorithm");
	columns->capacity = policy_column(rel, "capacity");
	columns->refill_amount = policy_column(rel, "refill_amount");
	columns->refill_period = policy_column(rel, "refill_period");
	columns->idle_ttl = policy_column(rel, "idle_ttl");
	columns->fail_mode = policy_column(rel, "fail_mode");
	columns->mode = policy_column(rel, "mode");
	columns->local_share = policy_column(rel, "local_share");
	columns->version = policy_column(rel, "version");
	columns->time_zone = get_attnum(RelationGetRelid(rel), "time_zone");
	columns->deny_cache = get_attnum(RelationGetRelid(rel), "deny_cache");
	columns->allowance = get_attnum(RelationGetRelid(rel), "allowance");
	columns->allowance_ttl = get_attnum(RelationGetRelid(rel), "allowance_ttl");
	columns->max_debt = get_attnum(RelationGetRelid(rel), "max_debt");
	columns->replay_window = get_attnum(RelationGetRelid(rel), "replay_window");
	columns->region_mode = get_attnum(RelationGetRelid(rel), "region_mode");
	columns->home_region = get_attnum(RelationGetRelid(rel), "home_region");
	columns->region_base = get_attnum(RelationGetRelid(rel), "region_base");
	columns->rollover = get_attnum(RelationGetRelid(rel), "rollover");
}

/* How a row's budget spans regions (region_mode, home_region, region_base). */
static void
policy_regions(Policy *policy, const Datum *values, const bool *nulls, const PolicyColumns *c)
{
	char	   *word;

	policy->region_mode = REGION_MODE_NONE;
	policy->home_region[0] = '\0';
	policy->region_base = -1;
	if (c->region_mode == InvalidAttrNumber || nulls[c->region_mode - 1])
		return;
	word = TextDatumGetCString(values[c->region_mode - 1]);
	policy->region_mode = strcmp(word, "home") == 0 ? REGION_MODE_HOME :
		strcmp(word, "split") == 0 ? REGION_MODE_SPLIT : REGION_MODE_INDEPENDENT;
	if (c->home_region != InvalidAttrNumber && !nulls[c->home_region - 1])
		text_to_cstring_buffer(DatumGetTextPP(values[c->home_region - 1]),
							   policy->home_region, sizeof(policy->home_region));
	if (c->region_base != InvalidAttrNumber && !nulls[c->region_base - 1])
		policy->region_base = Max(DatumGetInt64(values[c->region_base - 1]), 0);
	/* As the constraints say, should a row get past them: slices are per server and Redis. */
	if (policy->region_mode == REGION_MODE_HOME || policy->region_mode == REGION_MODE_SPLIT)
		policy->allowance = 0;
}

/* Fills policy (its name already set) from a row's values. */
static void
policy_from_row(Policy *policy, const Datum *values, const bool *nulls, const PolicyColumns *c,
				uint64 installation)
{
	char	   *word;
	int64		capacity;
	int64		refill_amount;
	int64		period_ms;

	policy->version = DatumGetInt32(values[c->version]);
	policy->installation = installation;
	word = TextDatumGetCString(values[c->fail_mode]);
	policy->fail_mode = parse_fail_mode(word);
	word = TextDatumGetCString(values[c->mode]);
	policy->mode = strcmp(word, "shadow") == 0 ? POLICY_MODE_SHADOW :
		strcmp(word, "disabled") == 0 ? POLICY_MODE_DISABLED : POLICY_MODE_ENFORCE;
	word = TextDatumGetCString(values[c->algorithm]);
	policy->algorithm = limit_algorithm(word);
	policy->idle_ttl_ms = nulls[c->idle_ttl] ? 0 :
		policy_interval_ms(DatumGetIntervalP(values[c->idle_ttl]));
	policy->local_share = DatumGetFloat8(DirectFunctionCall1(numeric_float8_no_overflow,
															 values[c->local_share]));
	policy->override = OVERRIDE_NONE;
	capacity = DatumGetInt64(values[c->capacity]);
	refill_amount = nulls[c->refill_amount] ? 0 : DatumGetInt64(values[c->refill_amount]);
	memset(&policy->period, 0, sizeof(policy->period));
	if (!nulls[c->refill_period])
		policy->period = *DatumGetIntervalP(values[c->refill_period]);
	period_ms = policy->period.month != 0 ? 0 : policy_interval_ms(&policy->period);
	memset(&policy->bucket, 0, sizeof(policy->bucket));
	strlcpy(policy->bucket.time_zone, "UTC", LIMIT_ZONE_LEN);
	if (c->time_zone != InvalidAttrNumber && !nulls[c->time_zone - 1])
		text_to_cstring_buffer(DatumGetTextPP(values[c->time_zone - 1]),
							   policy->bucket.time_zone, LIMIT_ZONE_LEN);
	policy->deny_cache = c->deny_cache == InvalidAttrNumber ||
		nulls[c->deny_cache - 1] || DatumGetBool(values[c->deny_cache - 1]);
	policy->allowance = 0;
	policy->allowance_ttl_ms = 0;
	if (c->allowance != InvalidAttrNumber && c->allowance_ttl != InvalidAttrNumber &&
		!nulls[c->allowance - 1] && !nulls[c->allowance_ttl - 1] &&
		limit_slices(policy->algorithm))
	{
		policy->allowance = DatumGetInt64(values[c->allowance - 1]);
		policy->allowance_ttl_ms =
			policy_interval_ms(DatumGetIntervalP(values[c->allowance_ttl - 1]));
		if (policy->allowance <= 0 || policy->allowance_ttl_ms <= 0)
			policy->allowance = 0;
	}
	policy->max_debt = -1;
	if (c->max_debt != InvalidAttrNumber && !nulls[c->max_debt - 1])
		policy->max_debt = Max(DatumGetInt64(values[c->max_debt - 1]), 0);
	policy->replay_window_ms = POLICY_REPLAY_WINDOW_MS;
	if (c->replay_window != InvalidAttrNumber && !nulls[c->replay_window - 1])
		policy->replay_window_ms =
			Max(policy_interval_ms(DatumGetIntervalP(values[c->replay_window - 1])), 1);
	policy_regions(policy, values, nulls, c);
	policy->rollover = 0;
	if (c->rollover != InvalidAttrNumber && !nulls[c->rollover - 1])
		policy->rollover = Max(DatumGetInt64(values[c->rollover - 1]), 0);
	policy->local_usable = false;
	if (policy->algorithm == ALGORITHM_CONCURRENCY)
		/* Leases: capacity at once, each living at most idle_ttl. */
		policy->usable = limit_params_init(&policy->bucket, ALGORITHM_CONCURRENCY, capacity,
										   0, NULL, policy->idle_ttl_ms, NULL);
	else
		policy_limits(policy, capacity, refill_amount, period_ms, policy->idle_ttl_ms);
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
	PolicyColumns columns;
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	TableScanDesc scan;
	HeapTuple	tuple;

	policy_columns(rel, &columns);
	scan = table_beginscan(rel, snapshot, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		char	   *name;

		heap_deform_tuple(tuple, desc, values, nulls);
		name = TextDatumGetCString(values[columns.name]);
		policy_from_row(hash_search(cache, name, HASH_ENTER, NULL), values, nulls, &columns,
						installation);
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
	policy_limits(policy, capacity, refill_amount, period_ms, policy->idle_ttl_ms);
	if (!policy->usable)
		policy_limits(policy, capacity, refill_amount, period_ms, 0);
}
