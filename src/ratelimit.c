/*
 * ratelimit.c
 *	  Module load: each layer defines its settings, in layer order (see
 *	  CONTRIBUTING.md), and the hooks into PostgreSQL are installed.
 */
#include "prelude.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/utility.h"
#include "utils/guc.h"

#include "base/clock.h"
#include "base/log_privacy.h"
#include "base/secret.h"
#include "engine/ledger.h"
#include "functions/enforce.h"
#include "local/buckets.h"
#include "local/keys.h"
#include "local/deny_cache.h"
#include "local/slices.h"
#include "observe/observe.h"
#include "policy/cache.h"
#include "policy/subject.h"
#include "redis/breaker.h"
#include "redis/connection.h"
#include "redis/deadline.h"
#include "redis/handoff.h"
#include "redis/regions.h"
#include "redis/tls.h"
#include "redis/url.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static ProcessUtility_hook_type previous_process_utility = NULL;
static shmem_request_hook_type previous_shmem_request_hook = NULL;
static shmem_startup_hook_type previous_shmem_startup_hook = NULL;

/* The shared-memory tables (local/table.c): local buckets, the deny cache, slices. */
static SharedTable *const tables[] = {&local_buckets_table, &deny_cache_table, &slices_table};

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

/* Asks for the shared memory of every layer that keeps some. */
static void
ratelimit_shmem_request(void)
{
	Size		size = 0;

	if (previous_shmem_request_hook)
		previous_shmem_request_hook();
	size = add_size(size, deadline_shmem_size());
	size = add_size(size, breaker_shmem_size());
	size = add_size(size, handoff_shmem_size());
	size = add_size(size, local_keys_shmem_size());
	for (int i = 0; i < (int) lengthof(tables); i++)
		size = add_size(size, table_shmem_size(tables[i]));
	size = add_size(size, policy_shmem_size());
	size = add_size(size, observe_shmem_size());
	RequestAddinShmemSpace(size);
	for (int i = 0; i < (int) lengthof(tables); i++)
		table_shmem_request(tables[i]);
	observe_shmem_request();
	handoff_shmem_request();
}

/* Creates or attaches to the shared memory of every layer. */
static void
ratelimit_shmem_startup(void)
{
	if (previous_shmem_startup_hook)
		previous_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	deadline_shmem_init();
	breaker_shmem_init();
	handoff_shmem_init();
	local_keys_shmem_init();
	for (int i = 0; i < (int) lengthof(tables); i++)
		table_shmem_init(tables[i]);
	policy_shmem_init();
	observe_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

void
_PG_init(void)
{
	bool		preloaded = process_shared_preload_libraries_in_progress;

	/* Layer by layer; first the secrets, whose rules the check of ratelimit.redis_url asks. */
	secret_init(preloaded);
	clock_init();
	log_privacy_init();
	redis_url_init();
	regions_init();
	tls_init();
	deadline_init();
	connection_init();
	breaker_init();
	local_keys_init(preloaded);
	for (int i = 0; i < (int) lengthof(tables); i++)
		table_init(tables[i], preloaded);
	subject_init();
	policy_cache_init();
	ledger_init();
	observe_init(preloaded);
	enforce_init();

	previous_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = ratelimit_process_utility;
	/* Shared memory exists only when preloaded. */
	if (preloaded)
	{
		previous_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = ratelimit_shmem_request;
		previous_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = ratelimit_shmem_startup;
	}
	/* After every definition: a placeholder left now is a typo. */
	MarkGUCPrefixReserved("ratelimit");
}
