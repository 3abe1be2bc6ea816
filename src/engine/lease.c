/*
 * lease.c
 *	  Concurrency leases: at most `capacity` held at once, released with their
 *	  transaction or session.
 *
 * A 'concurrency' policy limits how many holders a subject has at once (exports
 * running, connections open) rather than how often. rl_acquire takes a lease
 * in Redis (lua/concurrency/: a sorted set of lease ids scored by expiry),
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
#include "prelude.h"

#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

#include "algorithm/concurrency.h"
#include "base/clock.h"
#include "engine/booking.h"
#include "engine/decide.h"
#include "engine/lease.h"
#include "policy/placement.h"
#include "engine/ledger.h"
#include "engine/observer.h"
#include "policy/subject.h"
#include "redis/breaker.h"

/* The longest pause between two tries of a lease wait. */
#define LEASE_WAIT_MAX_PAUSE_MS 100
/* How long a waiter's place in the queue lives without a try renewing it (a waiter gone). */
#define LEASE_TICKET_TTL_MS 3000

typedef struct Lease
{
	LedgerEntry entry;
	char	   *key;			/* the lease set in Redis */
	char	   *subject;		/* NUL-terminated copy, for rl_release */
	char		id[64];
	Policy		policy;
	int			target;			/* the Redis it was taken in (a region's: engine/region.c) */
} Lease;

/* One call of a concurrency script. */
typedef struct LeaseCall
{
	RedisCall	call;
	Decision   *decision;
} LeaseCall;

/*
 * Fills call with operation's script on key for lease id ("" for a peek) and
 * a waiter's ticket ("" for none), in the current context.
 */
static void
lease_script_call_in(LeaseOperation operation, const Policy *policy, const char *key,
					 const char *id, const char *ticket, int target, RedisCall *call)
{
	const char **keys = palloc(CONCURRENCY_KEYS * sizeof(char *));
	const char **args = palloc(CONCURRENCY_ARGS * sizeof(char *));

	concurrency_keys(key, keys);
	concurrency_args(policy->bucket.capacity, policy->bucket.ttl_ms, id, ticket,
					 LEASE_TICKET_TTL_MS, args);
	memset(call, 0, sizeof(*call));
	call->script = concurrency_script(operation);
	call->nkeys = CONCURRENCY_KEYS;
	call->keys = keys;
	call->nargs = CONCURRENCY_ARGS;
	call->args = args;
	call->nresults = 4;
	call->target = target;
	call->results = palloc(4 * sizeof(long long));
}

/* The same, to the Redis of policy's region now (a call made at once). */
static void
lease_script_call(LeaseOperation operation, const Policy *policy, const char *key, const char *id,
				  const char *ticket, RedisCall *call)
{
	lease_script_call_in(operation, policy, key, id, ticket, placement_target(policy), call);
}

/* Runs a concurrency script; true with the decision filled when Redis answered. */
static bool
lease_call_redis(LeaseCall *lease, RedisFailure *failure)
{
	if (!redis_run_scripts(&lease->call, 1, 0, failure))
		return false;
	*failure = lease->call.failure;
	return lease->call.answered && decision_from_reply(lease->call.results, false, lease->decision, failure);
}

/*
 * Runs operation's script on key for lease id, unless its node's breaker
 * skips Redis. True with decision filled when Redis answered. Otherwise
 * decision's retry_after_ms is until the node is tried again and, when unsure
 * is given, it says whether Redis may have run the script all the same (the
 * request went out, and no answer or an error came back).
 */
static bool
lease_call(LeaseOperation operation, const Policy *policy, const char *key, const char *id,
		   const char *ticket,
		   Decision *decision, bool *unsure)
{
	LeaseCall	call = {.decision = decision};
	RedisFailure failure;
	bool		answered;

	lease_script_call(operation, policy, key, id, ticket, &call.call);
	answered = lease_call_redis(&call, &failure);
	engine_observe_redis(policy, answered, &failure, call.call.round_trip_us);
	/* The script failed on the request's own values: an error, never a fail mode. */
	if (!answered && decision_script_failed(policy, &failure, decision))
		decision_raise_script_error(decision);
	if (!answered)
		decision->retry_after_ms = call.call.retry_after_ms;
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

	/*
	 * Its policy's region is not looked up again: a reload since may have
	 * dropped it, and the release goes where the lease was taken.
	 */
	lease_script_call_in(LEASE_RELEASE, &lease->policy, lease->key, lease->id, "", lease->target, call);
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

/*
 * The decision when Redis cannot answer: the policy's fail mode, as every
 * decision's ('open' allows, and no lease is held; a concurrency policy has
 * no local bucket, so 'local' denies as 'closed'), until Redis is tried
 * again (lease_call's retry_after_ms, at least 1 ms).
 */
static void
lease_fail_mode(const DecisionRequest *request, Decision *decision)
{
	LocalKey	key = request_local_key(request);

	decision_by_fail_mode(request, &key, clock_now_ms(), Max(decision->retry_after_ms, 1),
						  decision);
	if (decision->allowed)
		decision->retry_after_ms = 0;
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

		if (!lease_call(LEASE_PEEK, &request->policy, key, "", "", decision, NULL))
			lease_fail_mode(request, decision);
		pfree(key);
	}
	decision_shadow(&request->policy, decision);
}

/*
 * The decisions rl_acquire would make now for count requests (of one
 * policy), taking no lease, in one round trip per Redis node (rl_usage).
 */
void
lease_peek_many(const DecisionRequest *requests, Decision *decisions, int count)
{
	RedisCall  *calls = palloc0(Max(count, 1) * sizeof(RedisCall));
	int		   *asked = palloc(Max(count, 1) * sizeof(int));
	int			ncalls = 0;
	RedisFailure failure;

	for (int i = 0; i < count; i++)
	{
		decision_init(&requests[i].policy, &decisions[i]);
		if (decision_fixed(&requests[i].policy, &decisions[i]))
			continue;
		lease_script_call(LEASE_PEEK, &requests[i].policy, lease_key(&requests[i]), "", "",
						  &calls[ncalls]);
		asked[ncalls++] = i;
	}
	if (ncalls > 0)
		(void) redis_run_scripts(calls, ncalls, 0, &failure);
	for (int c = 0; c < ncalls; c++)
	{
		const DecisionRequest *request = &requests[asked[c]];
		Decision   *decision = &decisions[asked[c]];
		RedisFailure outcome = calls[c].failure.kind != REDIS_FAILURE_NONE ? calls[c].failure : failure;
		bool		answered = calls[c].answered &&
			decision_from_reply(calls[c].results, false, decision, &outcome);

		engine_observe_redis(&request->policy, answered, &outcome, calls[c].round_trip_us);
		/* The script failed on the request's own values: an error, never a fail mode. */
		if (!answered && decision_script_failed(&request->policy, &outcome, decision))
			decision_raise_script_error(decision);
		if (!answered)
		{
			decision->retry_after_ms = calls[c].retry_after_ms;
			lease_fail_mode(request, decision);
		}
	}
	for (int i = 0; i < count; i++)
		decision_shadow(&requests[i].policy, &decisions[i]);
}

/* Raises an error unless policy is a concurrency policy: only those have leases. */
void
lease_check_policy(const Policy *policy)
{
	if (policy->algorithm != ALGORITHM_CONCURRENCY)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("rate limit policy \"%s\" is not a concurrency policy", policy->name),
				 errhint("Leases come from policies with algorithm 'concurrency'; use rl_consume for token buckets.")));
}

/*
 * One try at a lease (see lease_acquire), with a waiter's ticket ("" for a
 * take that does not wait): true when Redis answered that none is free for it.
 */
static bool
lease_try(const DecisionRequest *request, bool session, const char *ticket, Decision *decision)
{
	Lease	   *lease;
	char	   *id;
	MemoryContext old_context;
	bool		unsure;

	/*
	 * The lease is listed before Redis is asked: a call cut short (timeout,
	 * cancel) may still have taken it, and releasing an id that was never
	 * taken is harmless.
	 */
	lease = (Lease *) ledger_add(&lease_ops, sizeof(Lease), session, true);
	old_context = MemoryContextSwitchTo(ledger_memory());
	lease->key = lease_key(request);
	lease->subject = pnstrdup(request->subject, request->length);
	id = clock_unique_id();
	strlcpy(lease->id, id, sizeof(lease->id));
	pfree(id);
	lease->policy = request->policy;
	lease->target = request->target;
	MemoryContextSwitchTo(old_context);

	if (!lease_call(LEASE_ACQUIRE, &request->policy, lease->key, lease->id, ticket, decision,
					&unsure))
	{
		lease_fail_mode(request, decision);
		if (!unsure)
			ledger_forget(&lease->entry);	/* Redis was not asked, or refused the connection */
		return false;
	}
	if (decision->allowed)
		return false;
	ledger_forget(&lease->entry);	/* Redis said no: nothing was taken */
	return true;
}

/*
 * Takes a waiter's ticket out of the queue (its wait ended without a lease):
 * those behind it move up at once. With interrupts set aside (a cancel is
 * why it leaves, often); what Redis does not answer leaves when its ticket,
 * no longer renewed, expires.
 */
static void
lease_leave(const DecisionRequest *request, const char *ticket)
{
	RedisCall	call;
	char	   *key = lease_key(request);

	lease_script_call(LEASE_LEAVE, &request->policy, key, "", ticket, &call);
	booking_run_despite_interrupts(&call, 1);
	pfree(key);
}

/*
 * Tries for a lease until one is had or max_wait_ms has passed (see
 * lease_acquire); the queue's ticket is left by the caller.
 */
static void
lease_wait(const DecisionRequest *request, bool session, int64 max_wait_ms, const char *ticket,
		   int64 start_us, Decision *decision)
{
	int64		pause_ms = 10;

	while (lease_try(request, session, ticket, decision))
	{
		int64		left_ms = max_wait_ms - (clock_monotonic_us() - start_us) / 1000;

		if (left_ms <= 0)
			return;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(pause_ms, left_ms), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		if (booking_wait_ending())
		{
			lease_leave(request, ticket);
			CHECK_FOR_INTERRUPTS();
			return;
		}
		CHECK_FOR_INTERRUPTS();
		pause_ms = Min(pause_ms * 2, LEASE_WAIT_MAX_PAUSE_MS);
	}
}

/*
 * Takes one lease for a checked request of a concurrency policy (see
 * lease_check_policy), released when the transaction (or, with session, the
 * session) ends. With max_wait_ms, while Redis answers that none is free, the
 * waiter keeps a place in the subject's queue (a ticket, in arrival order:
 * lua/concurrency/common.lua) and tries again until the lease is its or
 * max_wait_ms has passed: a release is announced nowhere, so it looks again
 * after 10 ms, then twice as long each time up to LEASE_WAIT_MAX_PAUSE_MS.
 * A wait that ends without a lease from Redis (max_wait, a cancel, an error,
 * Redis failing) leaves the queue, so that no one waits behind it.
 */
void
lease_acquire(const DecisionRequest *request, bool session, int64 max_wait_ms,
			  Decision *decision)
{
	int64		start_us = clock_monotonic_us();
	char	   *ticket = max_wait_ms > 0 ? clock_unique_id() : "";
	MemoryContext context = CurrentMemoryContext;

	/* A disabled policy or an 'allow' or 'deny' subject takes no lease. */
	decision_init(&request->policy, decision);
	if (decision_fixed(&request->policy, decision))
	{
		decision_shadow(&request->policy, decision);
		engine_observe_decision(request, decision, 1);
		return;
	}
	if (max_wait_ms == 0)
		(void) lease_try(request, session, ticket, decision);
	else
	{
		PG_TRY();
		{
			lease_wait(request, session, max_wait_ms, ticket, start_us, decision);
		}
		PG_CATCH();
		{
			ErrorData  *error;

			/* Raised during a try (a cancel while Redis answered, a script's error). */
			MemoryContextSwitchTo(context);
			error = CopyErrorData();
			FlushErrorState();
			lease_leave(request, ticket);
			ReThrowError(error);
		}
		PG_END_TRY();
		if (!(decision->allowed && decision->source == DECISION_SOURCE_REDIS))
			lease_leave(request, ticket);
		decision->waited_ms = (clock_monotonic_us() - start_us) / 1000;
	}
	decision_shadow(&request->policy, decision);
	engine_observe_decision(request, decision, 1);
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
 * Gives back the latest lease this session holds for request's policy and
 * subject (whatever version of the policy took it). True when a lease was
 * released in Redis; one Redis did not answer for stays listed, to be
 * released again when its transaction or session ends.
 */
bool
lease_release(const DecisionRequest *request)
{
	LeaseMatch	match;
	Lease	   *found;
	Decision	decision;
	bool		answered = false;

	match.policy = request->policy.name;
	match.subject = pnstrdup(request->subject, request->length);
	found = (Lease *) ledger_find_last(lease_matches, &match);
	if (found != NULL)
	{
		answered = lease_call(LEASE_RELEASE, &found->policy, found->key, found->id, "",
							  &decision, NULL);
		if (answered)
			ledger_forget(&found->entry);
	}
	return answered && decision.allowed;
}
