/*
 * lease.c
 *	  Concurrency leases: at most `capacity` held at once, released with their
 *	  transaction or session.
 *
 * A 'concurrency' policy limits how many holders a subject has at once (exports
 * running, connections open) rather than how often. rl_acquire takes a lease
 * in Redis (lua/concurrency.lua: a sorted set of lease ids scored by expiry),
 * and the lease goes back when its transaction ends (the default), when its
 * session ends (scope 'session'), or at rl_release. A lease also expires by
 * itself after the policy's idle_ttl, so one whose backend died (SIGKILL, a
 * crash, a lost network) cannot be held forever.
 *
 * Releases run at transaction end and at backend exit, where nothing may raise:
 * interrupts are held, each Redis call keeps its command_timeout, and a release
 * that cannot be made is logged and left to the TTL (as are the leases of backends
 * that the postmaster ends after a crash). While Redis cannot answer,
 * 'open' policies allow (holding no lease) and the others deny: a lease cannot
 * be counted anywhere else.
 */
#include "ratelimit.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/ipc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "breaker.h"
#include "lease.h"
#include "log_privacy.h"
#include "scripts.h"
#include "subject.h"

typedef struct Lease
{
	char	   *key;			/* the lease set in Redis */
	char	   *subject;		/* NUL-terminated copy, for rl_release */
	char		id[64];
	Policy		policy;
	bool		session;		/* released at session end, not transaction end */
	SubTransactionId subxact;	/* who took it; a commit passes it to the parent */
} Lease;

static RedisScript concurrency_script = {
	.name = "concurrency",
	.body = script_concurrency,
};

static List *leases = NIL;
static MemoryContext lease_context = NULL;

/* One call of the concurrency script, for breaker_call. */
typedef struct LeaseCall
{
	const Policy *policy;
	const char *key;
	const char *id;
	const char *mode;			/* "acquire", "release" or "peek" */
	Decision   *decision;
} LeaseCall;

/* Runs the concurrency script; true with the decision filled when Redis answered. */
static bool
lease_call_redis(void *arg, RedisFailure *failure)
{
	LeaseCall  *call = arg;
	const Policy *policy = call->policy;
	Decision   *decision = call->decision;
	char		capacity[24];
	char		ttl[24];
	const char *keys[1] = {call->key};
	const char *args[5];
	long long	results[4];
	bool		answered;

	snprintf(capacity, sizeof(capacity), INT64_FORMAT, policy->bucket.capacity);
	snprintf(ttl, sizeof(ttl), INT64_FORMAT, policy->bucket.ttl_ms);
	args[0] = capacity;
	args[1] = ttl;
	args[2] = call->id;
	args[3] = rl_test_clock_ms ? rl_test_clock_ms : "";
	args[4] = call->mode;
	answered = redis_run_script(&concurrency_script, 1, keys, 5, args, results, 4, failure);
	return answered && decision_from_reply(results, decision, failure);
}

/*
 * Runs the concurrency script on key in mode, unless the breaker skips Redis.
 * True with decision filled when Redis answered. Otherwise, when unsure is
 * given, it says whether Redis may have run the script all the same (the
 * request went out, and no answer came back).
 */
static bool
lease_call(const Policy *policy, const char *key, const char *id, const char *mode,
		   Decision *decision, bool *unsure)
{
	LeaseCall	call = {.policy = policy,.key = key,.id = id,.mode = mode,.decision = decision};
	RedisFailure failure;
	bool		answered = breaker_call(lease_call_redis, &call, &failure);

	decision_note_redis(policy, answered, &failure);
	/* An error reply counts too: what a failing script wrote stays in Redis. */
	if (unsure != NULL)
		*unsure = !answered && failure.maybe_ran;
	return answered;
}

/* The decision when Redis cannot answer: 'open' allows (no lease is held), others deny. */
static void
lease_fail_mode(const Policy *policy, Decision *decision)
{
	decision->allowed = policy->fail_mode == FAIL_MODE_OPEN;
	decision->source = decision->allowed ? DECISION_SOURCE_FAIL_OPEN : DECISION_SOURCE_FAIL_CLOSED;
	decision->retry_after_ms = decision->allowed ? 0 : breaker_retry_after_ms();
	decision->reset_after_ms = decision->retry_after_ms;
}

/* Builds the lease set's key for request (palloc'd in the current context, no bigger than it). */
static char *
lease_key(const DecisionRequest *request)
{
	StringInfoData key;
	char	   *copy;

	initStringInfo(&key);
	subject_build_key(&key, &request->policy, request->subject, request->length);
	copy = pstrdup(key.data);	/* a StringInfo keeps 1 kB: a held lease keeps only the key */
	pfree(key.data);
	return copy;
}

/* Frees a lease. */
static void
lease_free(Lease *lease)
{
	pfree(lease->key);
	pfree(lease->subject);
	pfree(lease);
}

/* Drops a lease from the list and frees it. */
static void
lease_forget(Lease *lease)
{
	leases = list_delete_ptr(leases, lease);
	lease_free(lease);
}

/*
 * Gives one lease back. Raises nothing, except where PostgreSQL turns every
 * error into FATAL (at process exit).
 */
static void
lease_release(Lease *lease)
{
	MemoryContext context = CurrentMemoryContext;
	Decision	decision;
	volatile bool released = false;

	PG_TRY();
	{
		released = lease_call(&lease->policy, lease->key, lease->id, "release", &decision, NULL);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		FlushErrorState();
	}
	PG_END_TRY();
	if (!released)
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: a lease of policy \"%s\" was not released: it expires by its TTL",
						lease->policy.name)));
}

/*
 * Releases the leases that end now: the transaction's (from its subtransaction
 * from on; all of them: InvalidSubTransactionId), or with session, every one.
 */
static void
leases_release(SubTransactionId from, bool session)
{
	List	   *kept = NIL;
	ListCell   *cell;
	MemoryContext old_context;

	if (leases == NIL)
		return;
	HOLD_INTERRUPTS();
	old_context = MemoryContextSwitchTo(lease_context);
	foreach(cell, leases)
	{
		Lease	   *lease = lfirst(cell);

		if (session || (!lease->session &&
						(from == InvalidSubTransactionId || lease->subxact >= from)))
		{
			lease_release(lease);
			lease_free(lease);
		}
		else
			kept = lappend(kept, lease);
	}
	MemoryContextSwitchTo(old_context);
	RESUME_INTERRUPTS();
	list_free(leases);
	leases = kept;
	if (leases == NIL)
		MemoryContextReset(lease_context);
}

/* True when a transaction-scoped lease is held. */
static bool
leases_in_transaction(void)
{
	ListCell   *cell;

	foreach(cell, leases)
		if (!((Lease *) lfirst(cell))->session)
			return true;
	return false;
}

/* Transaction end releases the transaction's leases; PREPARE with some is refused. */
static void
lease_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (leases_in_transaction())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that holds concurrency leases"),
						 errhint("Release them with rl_release first, or take them with scope 'session'.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			leases_release(InvalidSubTransactionId, false);
			break;
		default:
			break;
	}
}

/* A rolled-back subtransaction releases its leases; a committed one hands them up. */
static void
lease_subxact_callback(SubXactEvent event, SubTransactionId subxact,
					   SubTransactionId parent, void *arg)
{
	ListCell   *cell;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		leases_release(subxact, false);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(cell, leases)
		{
			Lease	   *lease = lfirst(cell);

			if (lease->subxact == subxact)
				lease->subxact = parent;
		}
	}
}

/* Backend exit releases every lease still held. */
static void
lease_exit_callback(int code, Datum arg)
{
	leases_release(InvalidSubTransactionId, true);
}

/* Registers the callbacks; called once per backend from _PG_init. */
void
lease_init(void)
{
	lease_context = AllocSetContextCreate(TopMemoryContext, "ratelimit leases",
										  ALLOCSET_SMALL_SIZES);
	RegisterXactCallback(lease_xact_callback, NULL);
	RegisterSubXactCallback(lease_subxact_callback, NULL);
}

/* The decision rl_acquire would make now, taking no lease (rl_peek). */
void
lease_peek(const DecisionRequest *request, Decision *decision)
{
	decision_init(&request->policy, decision);
	if (!decision_fixed(&request->policy, decision))
	{
		char	   *key = lease_key(request);

		if (!lease_call(&request->policy, key, "", "peek", decision, NULL))
			lease_fail_mode(&request->policy, decision);
		pfree(key);
	}
	decision_shadow(&request->policy, decision);
}

/* Checks the arguments of rl_acquire or rl_release into request: a concurrency policy. */
static void
lease_request_init(FunctionCallInfo fcinfo, DecisionRequest *request)
{
	const Policy *policy = decision_policy_subject(fcinfo, request);

	if (policy->algorithm != ALGORITHM_CONCURRENCY)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("rate limit policy \"%s\" is not a concurrency policy", policy->name),
				 errhint("Leases come from policies with algorithm 'concurrency'; use rl_consume for token buckets.")));
}

/*
 * rl_acquire(policy, subject, scope DEFAULT 'transaction'): takes one lease,
 * released when the transaction (or, with 'session', the session) ends.
 */
RL_SQL_FUNCTION(rl_acquire)
{
	static bool exit_callback_registered = false;
	DecisionRequest request;
	Decision	decision;
	char	   *scope;
	bool		session;
	Lease	   *lease;
	char	   *id;
	MemoryContext old_context;
	bool		unsure;

	lease_request_init(fcinfo, &request);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("scope must not be null")));
	scope = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(scope, "transaction") != 0 && strcmp(scope, "session") != 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("scope must be 'transaction' or 'session'")));
	session = strcmp(scope, "session") == 0;

	/* A disabled policy or an 'allow' or 'deny' subject takes no lease. */
	decision_init(&request.policy, &decision);
	if (decision_fixed(&request.policy, &decision))
	{
		decision_shadow(&request.policy, &decision);
		decision_observe(&request, &decision, 1);
		return decision_to_datum(fcinfo, &decision);
	}

	/*
	 * The lease is listed before Redis is asked: a call cut short (timeout,
	 * cancel) may still have taken it, and releasing an id that was never
	 * taken is harmless.
	 */
	old_context = MemoryContextSwitchTo(lease_context);
	lease = palloc0(sizeof(Lease));
	lease->key = lease_key(&request);
	lease->subject = pnstrdup(request.subject, request.length);
	id = rl_unique_id();
	strlcpy(lease->id, id, sizeof(lease->id));
	pfree(id);
	lease->policy = request.policy;
	lease->session = session;
	lease->subxact = GetCurrentSubTransactionId();
	leases = lappend(leases, lease);
	MemoryContextSwitchTo(old_context);
	if (!exit_callback_registered)
	{
		before_shmem_exit(lease_exit_callback, (Datum) 0);
		exit_callback_registered = true;
	}

	if (!lease_call(&request.policy, lease->key, lease->id, "acquire", &decision, &unsure))
	{
		lease_fail_mode(&request.policy, &decision);
		if (!unsure)
			lease_forget(lease);	/* Redis was not asked, or refused the connection */
	}
	else if (!decision.allowed)
		lease_forget(lease);	/* Redis said no: nothing was taken */
	decision_shadow(&request.policy, &decision);
	decision_observe(&request, &decision, 1);
	return decision_to_datum(fcinfo, &decision);
}

/*
 * rl_release(policy, subject): gives back the latest lease this session holds
 * for them (whatever version of the policy took it). True when a lease was
 * released in Redis; one Redis did not answer for stays listed, to be
 * released again when its transaction or session ends.
 */
RL_SQL_FUNCTION(rl_release)
{
	DecisionRequest request;
	char	   *subject;
	Lease	   *found = NULL;
	ListCell   *cell;
	Decision	decision;
	bool		answered = false;

	lease_request_init(fcinfo, &request);
	subject = pnstrdup(request.subject, request.length);
	foreach(cell, leases)
	{
		Lease	   *lease = lfirst(cell);

		if (strcmp(lease->policy.name, request.policy.name) == 0 &&
			strcmp(lease->subject, subject) == 0)
			found = lease;
	}
	if (found != NULL)
	{
		answered = lease_call(&found->policy, found->key, found->id, "release", &decision, NULL);
		if (answered)
			lease_forget(found);
	}
	PG_RETURN_BOOL(answered && decision.allowed);
}
