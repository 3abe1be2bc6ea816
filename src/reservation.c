/*
 * reservation.c
 *	  Budget that follows the transaction: rl_reserve's tokens come back on rollback.
 *
 * rl_reserve decides like rl_consume and remembers what it took, with the
 * subtransaction that took it. When that subtransaction or the transaction
 * rolls back, the tokens are refunded (never above capacity); when the
 * transaction commits they stay spent. Each reservation has an id, and the
 * Redis refund marks it done, so a retried refund credits nothing twice.
 *
 * Refunds run inside abort processing, where nothing may raise an error and the
 * end of the transaction must not wait long: interrupts are held (so a cancel
 * cannot break in), a rollback waits for at most one Redis deadline (after a
 * refund without an answer the rest are not tried), and the breaker skips Redis
 * altogether once it is known to be down. A refund that cannot be made is logged
 * and lost: that can only deny more later, never grant more. Consecutive
 * reservations of one bucket (the rows of a statement) share one refund.
 * PREPARE TRANSACTION with reservations pending is refused: a prepared
 * transaction outlives the session that would have to refund it.
 */
#include "ratelimit.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "utils/memutils.h"

#include "decision.h"
#include "log_privacy.h"
#include "reservation.h"
#include "subject.h"

typedef struct Reservation
{
	DecisionRequest request;	/* the refund: mode BUCKET_REFUND, with an id */
	DecisionSource source;		/* who granted it: Redis or the local bucket */
	SubTransactionId subxact;	/* who took it; a commit passes it to the parent */
	char	   *redis_url;		/* the Redis it came from */
} Reservation;

static List *reservations = NIL;
static MemoryContext reservation_context = NULL;

/*
 * Remembers what a granted rl_reserve took, until its transaction ends. The
 * request carries the key of its bucket: the refund goes there, whatever the
 * settings say at rollback time.
 */
static void
reservation_remember(const DecisionRequest *request, DecisionSource source)
{
	MemoryContext old_context = MemoryContextSwitchTo(reservation_context);
	SubTransactionId subxact = GetCurrentSubTransactionId();
	Reservation *reservation;
	char	   *subject;

	/* Rows of one statement charge one bucket again and again: one refund for them all. */
	if (reservations != NIL)
	{
		reservation = llast(reservations);
		if (reservation->source == source && reservation->subxact == subxact &&
			strcmp(reservation->request.key, request->key) == 0)
		{
			reservation->request.cost = Min(reservation->request.cost + request->cost,
											request->policy.bucket.capacity);
			MemoryContextSwitchTo(old_context);
			return;
		}
	}

	reservation = palloc(sizeof(Reservation));
	subject = palloc(request->length);
	memcpy(subject, request->subject, request->length);
	reservation->request = *request;
	reservation->request.subject = subject;
	reservation->request.mode = BUCKET_REFUND;
	reservation->request.key = pstrdup(request->key);
	reservation->request.refund_id = rl_unique_id();
	reservation->source = source;
	reservation->subxact = subxact;
	reservation->redis_url = pstrdup(rl_redis_url ? rl_redis_url : "");
	reservations = lappend(reservations, reservation);
	MemoryContextSwitchTo(old_context);
}

/* Frees a reservation that is done with. */
static void
reservation_free(Reservation *reservation)
{
	pfree((char *) reservation->request.subject);
	pfree((char *) reservation->request.key);
	pfree((char *) reservation->request.refund_id);
	pfree(reservation->redis_url);
	pfree(reservation);
}

/*
 * Gives one reservation's tokens back where they came from. With give_up set
 * (an earlier refund of this rollback got no answer) Redis is not asked again,
 * so that a rollback waits for one deadline at most. Returns false when a
 * Redis refund got no answer. Raises nothing, except where PostgreSQL turns
 * every error into FATAL (at process exit).
 */
static bool
reservation_refund(Reservation *reservation, bool give_up)
{
	MemoryContext context = CurrentMemoryContext;
	const char *policy = reservation->request.policy.name;
	Decision	decision;
	volatile bool answered = true;

	PG_TRY();
	{
		if (reservation->source == DECISION_SOURCE_LOCAL)
			decision_refund_local(&reservation->request);
		else
		{
			const char *reason = NULL;

			if (strcmp(reservation->redis_url, rl_redis_url ? rl_redis_url : "") != 0)
				reason = "ratelimit.redis_url changed since";
			else if (give_up)
				reason = "Redis did not answer an earlier refund";
			else
			{
				decision_run(&reservation->request, &decision);
				if (decision.source != DECISION_SOURCE_REDIS)
				{
					reason = "Redis did not answer";
					answered = false;
				}
			}
			if (reason != NULL)
				ereport(LOG,
						(errhidestmt(true),
						 errhidecontext(true),
						 errmsg("ratelimit: a reservation of policy \"%s\" may not have been refunded: %s",
								policy, reason)));
		}
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(context);
		FlushErrorState();
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: a reservation of policy \"%s\" may not have been refunded", policy)));
		answered = false;
	}
	PG_END_TRY();
	return answered;
}

/* Refunds the reservations of subtransaction from and later ones (all: Invalid). */
static void
reservations_refund(SubTransactionId from)
{
	List	   *kept = NIL;
	ListCell   *cell;
	MemoryContext old_context;
	bool		give_up = false;

	if (reservations == NIL)
		return;
	HOLD_INTERRUPTS();
	old_context = MemoryContextSwitchTo(reservation_context);
	foreach(cell, reservations)
	{
		Reservation *reservation = lfirst(cell);

		if (from == InvalidSubTransactionId || reservation->subxact >= from)
		{
			if (!reservation_refund(reservation, give_up))
				give_up = true;
			reservation_free(reservation);
		}
		else
			kept = lappend(kept, reservation);
	}
	MemoryContextSwitchTo(old_context);
	RESUME_INTERRUPTS();
	list_free(reservations);
	reservations = kept;
	if (reservations == NIL)
		MemoryContextReset(reservation_context);
}

/* Forgets every reservation: its transaction committed, they stay spent. */
static void
reservations_forget(void)
{
	list_free(reservations);
	reservations = NIL;
	MemoryContextReset(reservation_context);
}

/* Transaction end: commit keeps, abort refunds, PREPARE is refused. */
static void
reservation_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (reservations != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot prepare a transaction that holds rate limit reservations"),
						 errdetail("A prepared transaction can outlive the session that would refund them."),
						 errhint("Use rl_consume in transactions that will be prepared.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			reservations_forget();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			reservations_refund(InvalidSubTransactionId);
			break;
		default:
			break;
	}
}

/* Subtransaction end: a commit hands its reservations to the parent, an abort refunds them. */
static void
reservation_subxact_callback(SubXactEvent event, SubTransactionId subxact,
							 SubTransactionId parent, void *arg)
{
	ListCell   *cell;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		reservations_refund(subxact);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(cell, reservations)
		{
			Reservation *reservation = lfirst(cell);

			if (reservation->subxact == subxact)
				reservation->subxact = parent;
		}
	}
}

/* Registers the transaction callbacks; called once per backend from _PG_init. */
void
reservation_init(void)
{
	reservation_context = AllocSetContextCreate(TopMemoryContext, "ratelimit reservations",
												ALLOCSET_SMALL_SIZES);
	RegisterXactCallback(reservation_xact_callback, NULL);
	RegisterSubXactCallback(reservation_subxact_callback, NULL);
}

/* Decides a checked take like rl_consume, and remembers what it took for a rollback. */
void
reservation_take(const DecisionRequest *request, Decision *decision)
{
	DecisionRequest take = *request;
	StringInfoData key;

	/* The key is built once: for the take, and for the refund. */
	initStringInfo(&key);
	subject_build_key(&key, &take.policy, take.subject, take.length);
	take.key = key.data;
	decision_run(&take, decision);
	if (decision->allowed &&
		(decision->source == DECISION_SOURCE_REDIS || decision->source == DECISION_SOURCE_LOCAL))
		reservation_remember(&take, decision->source);
	pfree(key.data);
}

/* rl_reserve(policy, subject, cost): rl_consume, refunded if its (sub)transaction rolls back. */
RL_SQL_FUNCTION(rl_reserve)
{
	DecisionRequest request;
	Decision	decision;

	decision_request_init(fcinfo, BUCKET_TAKE, &request);
	reservation_take(&request, &decision);
	return decision_to_datum(fcinfo, &decision);
}
