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
 * Held leases are entries of the ledger (ledger.c), which releases them when
 * their transaction ends, or for scope 'session' at DISCARD ALL or backend
 * exit: all that are due in one pipeline, and what cannot be released is
 * logged and left to the TTL (as are the leases of backends that the
 * postmaster ends after a crash). While Redis cannot answer,
 * 'open' policies allow (holding no lease) and the others deny: a lease cannot
 * be counted anywhere else.
 */
#include "ratelimit.h"

#include "utils/builtins.h"
#include "utils/memutils.h"

#include "breaker.h"
#include "lease.h"
#include "ledger.h"
#include "log_privacy.h"
#include "scripts.h"
#include "subject.h"

typedef struct Lease
{
	LedgerEntry entry;
	char	   *key;			/* the lease set in Redis */
	char	   *subject;		/* NUL-terminated copy, for rl_release */
	char		id[64];
	Policy		policy;
} Lease;

static RedisScript concurrency_script = {
	.name = "concurrency",
	.body = script_concurrency,
};

/* One call of the concurrency script, for breaker_call. */
typedef struct LeaseCall
{
	const Policy *policy;
	const char *key;
	const char *id;
	const char *mode;			/* "acquire", "release" or "peek" */
	Decision   *decision;
} LeaseCall;

/*
 * Fills call with the concurrency script on key in mode for lease id,
 * allocated in the current memory context.
 */
static void
lease_script_call(const Policy *policy, const char *key, const char *id, const char *mode,
				  RedisCall *call)
{
	const char **keys = palloc(sizeof(char *));
	const char **args = palloc(5 * sizeof(char *));

	keys[0] = key;
	args[0] = psprintf(INT64_FORMAT, policy->bucket.capacity);
	args[1] = psprintf(INT64_FORMAT, policy->bucket.ttl_ms);
	args[2] = id;
	args[3] = rl_test_clock_ms ? rl_test_clock_ms : "";
	args[4] = mode;
	memset(call, 0, sizeof(*call));
	call->script = &concurrency_script;
	call->nkeys = 1;
	call->keys = keys;
	call->nargs = 5;
	call->args = args;
	call->nresults = 4;
	call->results = palloc(4 * sizeof(long long));
}

/* Runs the concurrency script; true with the decision filled when Redis answered. */
static bool
lease_call_redis(void *arg, RedisFailure *failure)
{
	LeaseCall  *lease = arg;
	RedisCall	call;

	lease_script_call(lease->policy, lease->key, lease->id, lease->mode, &call);
	if (!redis_run_scripts(&call, 1, 0, failure))
		return false;
	*failure = call.failure;
	return call.answered && decision_from_reply(call.results, lease->decision, failure);
}

/*
 * Runs the concurrency script on key in mode, unless the breaker skips Redis.
 * True with decision filled when Redis answered. Otherwise, when unsure is
 * given, it says whether Redis may have run the script all the same (the
 * request went out, and no answer or an error came back).
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

/* Leases are always released in Redis. */
static bool
lease_settle_locally(LedgerEntry *entry)
{
	return false;
}

static void
lease_prepare_call(LedgerEntry *entry, RedisCall *call)
{
	Lease	   *lease = (Lease *) entry;

	lease_script_call(&lease->policy, lease->key, lease->id, "release", call);
}

static const char *
lease_policy_name(const LedgerEntry *entry)
{
	return ((const Lease *) entry)->policy.name;
}

static void
lease_free(LedgerEntry *entry)
{
	Lease	   *lease = (Lease *) entry;

	pfree(lease->key);
	pfree(lease->subject);
}

static const LedgerOps lease_ops = {
	.what = "lease",
	.given_back = "released",
	.if_lost = "Each expires by its TTL (the policy's idle_ttl).",
	.prepare_error = "cannot prepare a transaction that holds concurrency leases",
	.prepare_hint = "Release them with rl_release first, or take them with scope 'session'.",
	.settle_locally = lease_settle_locally,
	.prepare_call = lease_prepare_call,
	.policy_name = lease_policy_name,
	.free = lease_free,
};

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
	lease = (Lease *) ledger_add(&lease_ops, sizeof(Lease), session, true);
	old_context = MemoryContextSwitchTo(ledger_memory());
	lease->key = lease_key(&request);
	lease->subject = pnstrdup(request.subject, request.length);
	id = rl_unique_id();
	strlcpy(lease->id, id, sizeof(lease->id));
	pfree(id);
	lease->policy = request.policy;
	MemoryContextSwitchTo(old_context);

	if (!lease_call(&request.policy, lease->key, lease->id, "acquire", &decision, &unsure))
	{
		lease_fail_mode(&request.policy, &decision);
		if (!unsure)
			ledger_forget(&lease->entry);	/* Redis was not asked, or refused the connection */
	}
	else if (!decision.allowed)
		ledger_forget(&lease->entry);	/* Redis said no: nothing was taken */
	decision_shadow(&request.policy, &decision);
	decision_observe(&request, &decision, 1);
	return decision_to_datum(fcinfo, &decision);
}

/* A held lease of a policy and a subject, for ledger_find_last. */
typedef struct LeaseMatch
{
	const char *policy;
	const char *subject;
} LeaseMatch;

static bool
lease_matches(const LedgerEntry *entry, void *arg)
{
	const Lease *lease = (const Lease *) entry;
	const LeaseMatch *match = arg;

	return entry->ops == &lease_ops && strcmp(lease->policy.name, match->policy) == 0 &&
		strcmp(lease->subject, match->subject) == 0;
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
	LeaseMatch	match;
	Lease	   *found;
	Decision	decision;
	bool		answered = false;

	lease_request_init(fcinfo, &request);
	match.policy = request.policy.name;
	match.subject = pnstrdup(request.subject, request.length);
	found = (Lease *) ledger_find_last(lease_matches, &match);
	if (found != NULL)
	{
		answered = lease_call(&found->policy, found->key, found->id, "release", &decision, NULL);
		if (answered)
			ledger_forget(&found->entry);
	}
	PG_RETURN_BOOL(answered && decision.allowed);
}
