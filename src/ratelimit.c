/*
 * ratelimit.c
 *	  Module load, settings (GUCs) and the SQL-callable decision functions.
 */
#include "ratelimit.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "breaker.h"
#include "decision.h"
#include "lease.h"
#include "ledger.h"
#include "local.h"
#include "log_privacy.h"
#include "policy.h"
#include "redis.h"
#include "redis_url.h"
#include "reservation.h"
#include "secret.h"
#include "stats.h"
#include "subject.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

char	   *rl_redis_url = NULL;
int			rl_connect_timeout_ms = 1000;
int			rl_command_timeout_ms = 250;
int			rl_retry_interval_ms = 1000;
char	   *rl_key_prefix = NULL;
char	   *rl_key_scope = NULL;
char	   *rl_test_clock_ms = NULL;
int			rl_log_decisions = LOG_DECISIONS_NONE;
double		rl_log_sample_rate = 1.0;
bool		rl_postgrest_errors = false;
bool		rl_track_stats = true;
int			rl_stats_policies = 1000;

static const struct config_enum_entry log_decisions_options[] = {
	{"none", LOG_DECISIONS_NONE, false},
	{"denied", LOG_DECISIONS_DENIED, false},
	{"all", LOG_DECISIONS_ALL, false},
	{NULL, 0, false}
};

/* Rejects a malformed ratelimit.redis_url when it is set, not when it is first used. */
static bool
check_redis_url(char **newval, void **extra, GucSource source)
{
	RedisUrl	url;
	const char *problem;
	GucSource  *where;

	if (*newval != NULL && (*newval)[0] != '\0')
	{
		if (!redis_url_parse(*newval, &url, &problem))
		{
			/* Never echo the value: it may hold a password. */
			GUC_check_errmsg("invalid value for parameter \"ratelimit.redis_url\"");
			GUC_check_errdetail("%s", problem);
			GUC_check_errhint("Use redis://[user[:password]@]host[:port][/db] or unix://[user[:password]@]/path/to/socket[?db=N].");
			return false;
		}
		if (url.password != NULL && !secret_source_allowed("ratelimit.redis_url", source))
		{
			secret_refused("ratelimit.redis_url", source);
			return false;
		}
	}

	/*
	 * The value carries where it was set from, for assign_redis_url. guc.c
	 * frees an extra with free(), so it comes from malloc (guc_malloc is 16+).
	 */
	where = malloc(sizeof(GucSource));
	if (where == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		return false;
	}
	*where = source;
	*extra = where;
	return true;
}

/*
 * A new URL may mean another Redis, so the breaker is chosen again: the shared
 * one belongs to the URL set for the whole server (configuration file, command
 * line, ALTER SYSTEM), not to one a session, role or database sets.
 */
static void
assign_redis_url(const char *newval, void *extra)
{
	if (newval != NULL && newval[0] != '\0')
		secret_accepted("ratelimit.redis_url");
	breaker_url_changed(extra != NULL && *(GucSource *) extra <= PGC_S_GLOBAL);
}

/* The postmaster's timeouts are the server's own (see breaker_timeout_changed). */
static void
assign_connect_timeout(int newval, void *extra)
{
	breaker_timeout_changed(true, newval);
}

static void
assign_command_timeout(int newval, void *extra)
{
	breaker_timeout_changed(false, newval);
}

static ProcessUtility_hook_type previous_process_utility = NULL;

/*
 * DISCARD ALL (outside a transaction block, where it fails) gives back the
 * session's leases first; COMMIT PREPARED may have committed a change of the
 * policies, which bumps their generation.
 */
static void
ratelimit_process_utility(PlannedStmt *statement, const char *query_string, bool read_only_tree,
						  ProcessUtilityContext context, ParamListInfo params,
						  QueryEnvironment *query_env, DestReceiver *dest, QueryCompletion *completion)
{
	Node	   *tree = statement->utilityStmt;

	if (IsA(tree, DiscardStmt) && ((DiscardStmt *) tree)->target == DISCARD_ALL &&
		!IsTransactionBlock())
		ledger_discard_all();
	if (previous_process_utility)
		previous_process_utility(statement, query_string, read_only_tree, context, params,
								 query_env, dest, completion);
	else
		standard_ProcessUtility(statement, query_string, read_only_tree, context, params,
								query_env, dest, completion);
	if (IsA(tree, TransactionStmt) &&
		((TransactionStmt *) tree)->kind == TRANS_STMT_COMMIT_PREPARED)
		policy_prepared_committed();
}

static shmem_request_hook_type previous_shmem_request_hook = NULL;
static shmem_startup_hook_type previous_shmem_startup_hook = NULL;

/* Asks for the shared memory of the breaker, the local buckets and the statistics. */
static void
ratelimit_shmem_request(void)
{
	if (previous_shmem_request_hook)
		previous_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(add_size(breaker_shmem_size(), local_shmem_size()),
											 stats_shmem_size()), policy_shmem_size()));
	local_shmem_request();
	stats_shmem_request();
}

/* Creates or attaches to the shared breaker, local buckets and statistics. */
static void
ratelimit_shmem_startup(void)
{
	if (previous_shmem_startup_hook)
		previous_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	breaker_shmem_init();
	local_shmem_init();
	stats_shmem_init();
	policy_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

/* Key segments must be safe ids: no separator, no brace, bounded length. */
static bool
check_key_segment(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (!subject_is_safe_id(*newval, strlen(*newval)))
	{
		GUC_check_errdetail("Use 1 to %d letters, digits, \"_\", \".\" or \"-\".",
							SUBJECT_SAFE_MAX_BYTES);
		return false;
	}
	return true;
}

/* The prefix may not be empty: every key starts with it. */
static bool
check_key_prefix(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("The key prefix must not be empty.");
		return false;
	}
	return check_key_segment(newval, extra, source);
}

/* The test clock is empty (Redis TIME) or milliseconds since the epoch. */
static bool
check_test_clock(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;

	if (p == NULL || *p == '\0')
		return true;
	if (strlen(p) > 15 || strspn(p, "0123456789") != strlen(p))
	{
		GUC_check_errdetail("Give milliseconds since the epoch (at most 15 digits), or an empty string for Redis TIME.");
		return false;
	}
	return true;
}

/* Defines the settings and registers the policy cache callback. */
void
_PG_init(void)
{
	/* First: the check hook of ratelimit.redis_url asks where secrets may come from. */
	secret_define_settings(process_shared_preload_libraries_in_progress);
	DefineCustomStringVariable("ratelimit.redis_url",
							   "Redis to keep buckets in: redis://[user[:password]@]host[:port][/db] or unix:///path[?db=N].",
							   "Only superusers can read or set it: it may hold a password.",
							   &rl_redis_url, "", PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE,
							   check_redis_url, assign_redis_url, NULL);
	DefineCustomIntVariable("ratelimit.connect_timeout",
							"Longest wait to connect and authenticate to Redis.",
							NULL, &rl_connect_timeout_ms, 1000, 1, 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS, NULL, assign_connect_timeout, NULL);
	DefineCustomIntVariable("ratelimit.command_timeout",
							"Longest wait for Redis to answer one decision.",
							"When it passes, the policy's fail mode decides.",
							&rl_command_timeout_ms, 250, 1, 60 * 1000,
							PGC_USERSET, GUC_UNIT_MS, NULL, assign_command_timeout, NULL);
	DefineCustomIntVariable("ratelimit.retry_interval",
							"How long decisions skip a Redis that could not be reached before one probe tries again.",
							NULL, &rl_retry_interval_ms, 1000, 1, 3600 * 1000,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomStringVariable("ratelimit.key_prefix",
							   "First segment of every Redis key.",
							   NULL, &rl_key_prefix, "rl", PGC_SUSET, 0,
							   check_key_prefix, NULL, NULL);
	DefineCustomStringVariable("ratelimit.key_scope",
							   "Second segment of every Redis key; empty means the database name.",
							   "Servers that should share buckets use the same scope.",
							   &rl_key_scope, "", PGC_SUSET, 0,
							   check_key_segment, NULL, NULL);
	DefineCustomStringVariable("ratelimit.test_clock_ms",
							   "For tests: the time buckets see, in ms since the epoch; empty means Redis TIME.",
							   NULL, &rl_test_clock_ms, "", PGC_SUSET,
							   GUC_NOT_IN_SAMPLE, check_test_clock, NULL, NULL);
	DefineCustomEnumVariable("ratelimit.log_decisions",
							 "Which decisions get a log line: none, denied or all.",
							 "A line holds policy, version, cost, decision, source and a hash of the subject, never the subject.",
							 &rl_log_decisions, LOG_DECISIONS_NONE, log_decisions_options,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("ratelimit.log_sample_rate",
							 "Share of the decisions chosen by ratelimit.log_decisions that are logged.",
							 NULL, &rl_log_sample_rate, 1.0, 0.0, 1.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("ratelimit.track_stats",
							 "Count decisions and Redis calls in rl_stats (needs shared_preload_libraries).",
							 NULL, &rl_track_stats, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("ratelimit.postgrest_errors",
							 "rl_enforce raises the error PostgREST turns into an HTTP 429 or 503 with headers.",
							 "SQLSTATE PGRST, with the JSON message and detail PostgREST reads.",
							 &rl_postgrest_errors, false, PGC_USERSET, 0, NULL, NULL, NULL);
	log_privacy_init();
	redis_init();
	policy_cache_init();
	ledger_init();
	previous_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = ratelimit_process_utility;

	/* Shared memory, and the setting that sizes it, exist only when preloaded. */
	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomIntVariable("ratelimit.local_buckets",
								"Slots for local fallback buckets in shared memory.",
								NULL, &rl_local_buckets, 10000, 128, 10 * 1000 * 1000,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
		DefineCustomIntVariable("ratelimit.stats_policies",
								"Policies (of all databases together) that rl_stats counts apart; the rest are counted as one.",
								NULL, &rl_stats_policies, 1000, 16, 1000 * 1000,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
		previous_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = ratelimit_shmem_request;
		previous_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = ratelimit_shmem_startup;
	}
	/* After every definition: a placeholder left now is a typo. */
	MarkGUCPrefixReserved("ratelimit");
}

/* rl_consume(policy, subject, cost): one atomic decision; tokens taken only if allowed. */
RL_SQL_FUNCTION(rl_consume)
{
	Decision	decision;

	decision_make(fcinfo, BUCKET_TAKE, &decision);
	return decision_to_datum(fcinfo, &decision);
}

/*
 * rl_enforce(policy, subject, cost): rl_consume, but a denial raises RL429 (over
 * quota) or RL503 (Redis unavailable and the policy fails closed).
 */
RL_SQL_FUNCTION(rl_enforce)
{
	Decision	decision;

	decision_make(fcinfo, BUCKET_TAKE, &decision);
	decision_enforce(fcinfo->flinfo->fn_oid, &decision);
	return decision_to_datum(fcinfo, &decision);
}

/* rl_health(): Redis reachable or not since when, the breaker, the local buckets. */
RL_SQL_FUNCTION(rl_health)
{
	BreakerHealth health;
	TupleDesc	desc;
	Datum		values[8];
	bool		nulls[8] = {0};
	int			in_use,
				slots;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("function returning a record called in a context that cannot accept it")));
	breaker_health(&health);
	local_usage(&in_use, &slots);

	values[0] = BoolGetDatum(health.reachable);
	values[1] = TimestampTzGetDatum(health.since);
	nulls[1] = health.since == 0;
	values[2] = CStringGetTextDatum(health.open ? "open" : "closed");
	values[3] = Int64GetDatum(health.retry_in_ms);
	if (health.last_failure.kind == REDIS_FAILURE_NONE)
		nulls[4] = true;
	else
		values[4] = CStringGetTextDatum(psprintf("%s: %s",
												 redis_failure_kind_name(health.last_failure.kind),
												 health.last_failure.detail));
	values[5] = Int32GetDatum(in_use);
	values[6] = Int32GetDatum(slots);
	values[7] = BoolGetDatum(health.shared);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

PG_FUNCTION_INFO_V1(rl_local_available);

/* rl_local_available(): true when local fallback buckets exist (the library was preloaded). */
Datum
rl_local_available(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(local_available());
}

/* Logs an administrative action on a policy: the policy and the action, never the subject. */
static void
audit(const char *action, const char *policy)
{
	ereport(LOG,
			(errhidestmt(true),
			 errhidecontext(true),
			 errmsg("ratelimit: %s on policy \"%s\"", action, policy)));
}

/* rl_peek(policy, subject, cost): the decision rl_consume would make, taking nothing. */
RL_SQL_FUNCTION(rl_peek)
{
	DecisionRequest request;
	Decision	decision;

	decision_request_init(fcinfo, BUCKET_PEEK, &request);
	if (request.policy.algorithm == ALGORITHM_CONCURRENCY)
		lease_peek(&request, &decision);
	else
		decision_run(&request, &decision);
	return decision_to_datum(fcinfo, &decision);
}

/* rl_refund(policy, subject, amount): gives tokens back, never above capacity. */
RL_SQL_FUNCTION(rl_refund)
{
	Decision	decision;

	decision_make(fcinfo, BUCKET_REFUND, &decision);
	audit("refund", decision.policy);
	return decision_to_datum(fcinfo, &decision);
}

/* rl_reset(policy, subject): a full bucket; false when Redis could not answer. */
RL_SQL_FUNCTION(rl_reset)
{
	DecisionRequest request;
	bool		done;

	decision_request_init(fcinfo, BUCKET_PEEK, &request);
	done = decision_reset(&request);
	audit("reset", request.policy.name);
	PG_RETURN_BOOL(done);
}

/* Milliseconds since the Unix epoch of a timestamp. */
int64
rl_epoch_ms(TimestampTz timestamp)
{
	return timestamp / 1000 + (int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
}

/* Now in ms since the epoch: ratelimit.test_clock_ms when set, else this server's clock. */
int64
rl_now_ms(void)
{
	if (rl_test_clock_ms != NULL && rl_test_clock_ms[0] != '\0')
		return strtoi64(rl_test_clock_ms, NULL, 10);
	return rl_epoch_ms(GetCurrentTimestamp());
}

/*
 * A palloc'd id no other backend, here or on another server sharing the Redis,
 * will make: pid, start time, a random per-backend nonce, a counter.
 */
char *
rl_unique_id(void)
{
	static uint64 nonce = 0;
	static uint64 counter = 0;

	if (nonce == 0 && (!pg_strong_random(&nonce, sizeof(nonce)) || nonce == 0))
		nonce = (uint64) MyStartTimestamp ^ ((uint64) MyProcPid << 32) ^ 1;
	return psprintf("%d.%llx.%llu", MyProcPid, (unsigned long long) nonce,
					(unsigned long long) ++counter);
}
