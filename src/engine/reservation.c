/*
 * reservation.c
 *	  Budget that follows the transaction: rl_reserve's tokens come back on rollback.
 *
 * rl_reserve decides like rl_consume and enters what it took in the ledger
 * (ledger.c), owned by the subtransaction that took it. When that
 * subtransaction or the transaction rolls back, the tokens are refunded (never
 * above capacity); when the transaction commits they stay spent. Each
 * reservation has an id, and the Redis refund marks it done, so a retried
 * refund credits nothing twice. Consecutive reservations of one bucket (the
 * rows of a statement) share one refund.
 *
 * This is for work whose effect stays inside the transaction (rows written):
 * work whose effect leaves it (rows delivered to a client, a file exported, an
 * e-mail sent) must use rl_consume, since a caller who rolls back after the
 * effect would otherwise get the tokens back for nothing.
 */
#include "prelude.h"

#include "access/xact.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "engine/decide.h"
#include "engine/denial.h"
#include "engine/ledger.h"
#include "engine/reservation.h"
#include "policy/placement.h"
#include "policy/subject.h"
#include "redis/url.h"

typedef struct Reservation
{
	LedgerEntry entry;
	DecisionRequest request;	/* the refund: mode LIMIT_REFUND, with an id */
	DecisionSource source;		/* who granted it: Redis or the local bucket */
} Reservation;

/* A reservation granted by the local bucket goes back there. */
static bool
reservation_settle_locally(LedgerEntry *entry)
{
	Reservation *reservation = (Reservation *) entry;

	if (reservation->source != DECISION_SOURCE_LOCAL)
		return false;
	decision_refund_local(&reservation->request);
	return true;
}

static void
reservation_prepare_call(LedgerEntry *entry, RedisCall *call)
{
	decision_redis_call(&((Reservation *) entry)->request, call);
}

/* Refunded by Redis: a denial this server remembers for the subject is out of date. */
static void
reservation_given_back(LedgerEntry *entry)
{
	const DecisionRequest *request = &((Reservation *) entry)->request;
	LocalKey	key = request_local_key(request);

	denial_forget(request, &key);
}

static const char *
reservation_policy_name(const LedgerEntry *entry)
{
	return ((const Reservation *) entry)->request.policy.name;
}

static void
reservation_free(LedgerEntry *entry)
{
	Reservation *reservation = (Reservation *) entry;

	pfree((char *) reservation->request.subject);
	pfree((char *) reservation->request.redis_key);
	pfree((char *) reservation->request.refund_id);
	if (reservation->request.request_id != NULL)
		pfree((char *) reservation->request.request_id);
}

static const LedgerOps reservation_ops = {
	.what = "reservation",
	.given_back = "refunded",
	.if_lost = "Their tokens stay spent: that can only deny more later, never grant more.",
	.prepare_error = "cannot prepare a transaction that holds rate limit reservations",
	.prepare_detail = "A prepared transaction can outlive the session that would refund them.",
	.prepare_hint = "Use rl_consume in transactions that will be prepared.",
	.settle_locally = reservation_settle_locally,
	.prepare_call = reservation_prepare_call,
	.answered = reservation_given_back,
	.policy_name = reservation_policy_name,
	.free = reservation_free,
};

/*
 * Enters what a granted rl_reserve took in the ledger, until its transaction
 * ends. The request carries the key of its bucket: the refund goes there,
 * whatever the settings say at rollback time.
 */
static void
reservation_remember(const DecisionRequest *request, DecisionSource source)
{
	Reservation *last = (Reservation *) ledger_last();
	Reservation *reservation;
	MemoryContext old_context;
	char	   *subject;

	/* Rows of one statement charge one bucket again and again: one refund for them all. */
	if (last != NULL && last->entry.ops == &reservation_ops && last->source == source &&
		request->request_id == NULL && last->request.request_id == NULL &&
		last->entry.subxact == GetCurrentSubTransactionId() &&
		strcmp(last->entry.redis_url, redis_url_own()) == 0 &&
		strcmp(last->request.redis_key, request->redis_key) == 0 &&
		(limit_refills(request->policy.algorithm) || last->request.at_ms == request->at_ms))
	{
		last->request.cost = Min(last->request.cost + request->cost,
								 policy_most_cost(&request->policy));
		return;
	}

	reservation = (Reservation *) ledger_add(&reservation_ops, sizeof(Reservation), false, false);
	old_context = MemoryContextSwitchTo(ledger_memory());
	subject = palloc(request->length);
	memcpy(subject, request->subject, request->length);
	reservation->request = *request;
	reservation->request.subject = subject;
	reservation->request.mode = LIMIT_REFUND;
	reservation->request.redis_key = pstrdup(request->redis_key);
	reservation->request.refund_id = clock_unique_id();
	reservation->request.max_wait_ms = 0;
	/* Given back, its request id is forgotten too: the transaction retried is charged again. */
	if (request->request_id != NULL)
		reservation->request.request_id = pstrdup(request->request_id);
	reservation->source = source;
	MemoryContextSwitchTo(old_context);
}

/*
 * Decides checked takes like rl_consume_many, in one round trip per node, and
 * remembers what each took for a rollback (a statement trigger's subjects).
 */
void
reservation_take_many(const DecisionRequest *requests, Decision *decisions, int count)
{
	DecisionRequest *takes = palloc(Max(count, 1) * sizeof(DecisionRequest));
	int64		now_ms = clock_now_ms();

	for (int i = 0; i < count; i++)
	{
		StringInfoData key;

		takes[i] = requests[i];
		initStringInfo(&key);
		subject_build_key(&key, &takes[i].policy, takes[i].subject, takes[i].length);
		takes[i].redis_key = key.data;
		takes[i].at_ms = now_ms;
	}
	batch_run(takes, decisions, count);
	for (int i = 0; i < count; i++)
	{
		/* A booking of a fixed window is in the next window: it goes back there. */
		if (decisions[i].wait_ms > 0)
			takes[i].at_ms = limit_booked_at_ms(&takes[i].policy.bucket, takes[i].at_ms);
		/* A slice's tokens came from Redis: a rollback gives them back there. */
		if (decisions[i].allowed &&
			(decisions[i].source == DECISION_SOURCE_REDIS ||
			 decisions[i].source == DECISION_SOURCE_ALLOWANCE))
			reservation_remember(&takes[i], DECISION_SOURCE_REDIS);
		else if (decisions[i].allowed && decisions[i].source == DECISION_SOURCE_LOCAL)
			reservation_remember(&takes[i], DECISION_SOURCE_LOCAL);
		pfree((char *) takes[i].redis_key);
	}
	pfree(takes);
	/* Raised once what was granted is in the ledger: the rollback it causes gives it back. */
	for (int i = 0; i < count; i++)
		decision_raise_script_error(&decisions[i]);
}

/* Decides a checked take like rl_consume, and remembers what it took for a rollback. */
void
reservation_take(const DecisionRequest *request, Decision *decision)
{
	reservation_take_many(request, decision, 1);
}

/* A reservation of this transaction on a bucket, for ledger_find_last. */
static bool
reservation_of_key(const LedgerEntry *entry, void *key)
{
	return entry->ops == &reservation_ops &&
		strcmp(((const Reservation *) entry)->request.redis_key, (const char *) key) == 0;
}

/*
 * Settles a take of cost tokens (rl_reserve's or rl_consume's) to what it
 * really cost, actual (rl_settle): less gives the difference back; more takes
 * it even beyond what the bucket holds, leaving the subject owing at most the
 * policy's max_debt (of a difference that would owe more, what stays within is
 * taken, and the decision is a denial). The latest reservation of this
 * transaction on the bucket follows what was taken, so a rollback gives back
 * what was really taken.
 */
void
reservation_settle(const DecisionRequest *request, int64 cost, int64 actual,
				   Decision *decision)
{
	DecisionRequest settle = *request;
	Reservation *reservation;
	int64		most = policy_most_cost(&request->policy) + policy_max_debt(&request->policy);
	StringInfoData key;

	initStringInfo(&key);
	subject_build_key(&key, &settle.policy, settle.subject, settle.length);
	settle.redis_key = key.data;
	settle.at_ms = clock_now_ms();
	reservation = (Reservation *) ledger_find_last(reservation_of_key, key.data);
	if (reservation != NULL && !limit_refills(settle.policy.algorithm))
		settle.at_ms = reservation->request.at_ms;	/* a window's take is settled in its window */
	if (actual == cost)
	{
		settle.mode = LIMIT_PEEK;
		settle.cost = Min(Max(cost, 1), policy_most_cost(&settle.policy));
	}
	else if (actual < cost)
	{
		settle.mode = LIMIT_REFUND;
		settle.cost = cost - actual;
	}
	else
	{
		placement_refuse_split(&settle.policy, "settling up (rl_settle with actual > cost)");
		if (!limit_books(settle.policy.algorithm))
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("rate limit policy \"%s\" cannot be settled up", settle.policy.name),
					 errdetail("A %s cannot owe: it has no later time of its own.",
							   limit_algorithm_name(settle.policy.algorithm)),
					 errhint("Settle up token_bucket, gcra or fixed_window policies; with a sliding window or log, reserve the most the work may cost and settle down.")));
		settle.mode = LIMIT_OWE;
		settle.cost = Min(actual - cost, most);
	}
	decision_run(&settle, decision);
	if (settle.mode == LIMIT_PEEK)
		decision->allowed = true;
	else if (settle.mode == LIMIT_REFUND && decision->source == DECISION_SOURCE_REDIS)
		decision->allowed = true;
	if (reservation != NULL && decision->source == DECISION_SOURCE_REDIS)
	{
		if (settle.mode == LIMIT_REFUND)
			reservation->request.cost = Max(reservation->request.cost - settle.cost, 0);
		else if (settle.mode == LIMIT_OWE)
			reservation->request.cost = Min(reservation->request.cost + decision->settled, most);
	}
	pfree(key.data);
}
