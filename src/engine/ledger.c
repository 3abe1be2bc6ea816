/*
 * ledger.c
 *	  What a transaction or session owes Redis when it ends: the refunds of
 *	  its reservations, the releases of its leases.
 *
 * Reservations (reservation.c) and leases (lease.c) are entries of one list,
 * each owned by the subtransaction that made it: a subtransaction that
 * commits hands its entries to its parent, one that rolls back gives its
 * entries back. At the end of the transaction, reservations are refunded on
 * rollback and forgotten on commit, transaction-scoped leases are released
 * either way; session-scoped leases are released by DISCARD ALL (what a
 * connection pooler runs between clients) and at backend exit.
 *
 * Whatever is due at one moment goes to Redis as one pipeline: one round trip
 * per connection, within connect_timeout and a command_timeout for each
 * thousand entries, as a batch. This runs inside commit and abort
 * processing, where nothing may raise and interrupts are held: what could not
 * be given back is logged once, as a count and the policies' names (never a
 * subject), and is lost. A lost refund can only deny more later, never grant
 * more; a lost release expires by the lease's TTL.
 */
#include "prelude.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/ipc.h"
#include "utils/memutils.h"

#include "base/clock.h"
#include "base/log_limit.h"
#include "engine/ledger.h"
#include "engine/observer.h"
#include "redis/breaker.h"
#include "redis/deadline.h"
#include "redis/url.h"

/* The most policies a log line names; the rest are counted. */
#define LEDGER_LOG_POLICIES 5

/* What becomes of an entry when its owner ends. */
typedef enum LedgerFate
{
	LEDGER_KEEP,
	LEDGER_SETTLE,
	LEDGER_FORGET
} LedgerFate;

/* The moment entries may fall due. */
typedef enum LedgerMoment
{
	LEDGER_SUBXACT_ABORT,
	LEDGER_PRE_COMMIT,
	LEDGER_COMMIT,
	LEDGER_ABORT,
	LEDGER_DISCARD_ALL,
	LEDGER_EXIT
} LedgerMoment;

/* Entries of one kind not given back for one reason, for the log line. */
typedef struct LedgerLoss
{
	const LedgerOps *ops;
	const char *reason;
	bool		uncertain;		/* the request went out: Redis may still run it */
	int			count;
	int			npolicies;
	const char *policies[LEDGER_LOG_POLICIES];
	int			policy_counts[LEDGER_LOG_POLICIES];
	int			other_policies;
	struct LedgerLoss *next;
} LedgerLoss;

static List *entries = NIL;
static MemoryContext ledger_context = NULL;
static bool exit_callback_registered = false;

static void ledger_exit_callback(int code, Datum arg);

/* The context entries and what they point to live in. */
MemoryContext
ledger_memory(void)
{
	return ledger_context;
}

/*
 * Adds an entry of size bytes (a LedgerEntry first) for ops, owned by the
 * current subtransaction, allocated zeroed in ledger_memory(). The caller
 * fills its own fields.
 */
LedgerEntry *
ledger_add(const LedgerOps *ops, Size size, bool session, bool ends_with_commit)
{
	MemoryContext old_context = MemoryContextSwitchTo(ledger_context);
	LedgerEntry *entry;

	Assert(size >= sizeof(LedgerEntry));
	entry = palloc0(size);
	entry->ops = ops;
	entry->subxact = GetCurrentSubTransactionId();
	entry->session = session;
	entry->ends_with_commit = ends_with_commit;
	entry->redis_url = pstrdup(redis_url_own());
	entries = lappend(entries, entry);
	MemoryContextSwitchTo(old_context);
	if (!exit_callback_registered)
	{
		before_shmem_exit(ledger_exit_callback, (Datum) 0);
		exit_callback_registered = true;
	}
	return entry;
}

/* The latest entry, or NULL. */
LedgerEntry *
ledger_last(void)
{
	return entries != NIL ? llast(entries) : NULL;
}

/* The latest entry that match accepts, or NULL. */
LedgerEntry *
ledger_find_last(bool (*match) (const LedgerEntry *entry, void *arg), void *arg)
{
	LedgerEntry *found = NULL;
	ListCell   *cell;

	foreach(cell, entries)
		if (match(lfirst(cell), arg))
			found = lfirst(cell);
	return found;
}

/* Frees an entry that is done with. */
static void
ledger_free(LedgerEntry *entry)
{
	entry->ops->free(entry);
	pfree(entry->redis_url);
	pfree(entry);
}

/* Drops an entry without giving it back (Redis never took it, or it was given back already). */
void
ledger_forget(LedgerEntry *entry)
{
	entries = list_delete_ptr(entries, entry);
	ledger_free(entry);
	if (entries == NIL)
		MemoryContextReset(ledger_context);
}

/*
 * Counts entry as not given back for reason; uncertain when the request went
 * out, so that Redis may still run it (and give it back) later.
 */
static void
loss_add(LedgerLoss **losses, const LedgerEntry *entry, const char *reason, bool uncertain)
{
	const char *policy = entry->ops->policy_name(entry);
	LedgerLoss *loss;
	int			i;

	for (loss = *losses; loss != NULL; loss = loss->next)
		if (loss->ops == entry->ops && strcmp(loss->reason, reason) == 0 &&
			loss->uncertain == uncertain)
			break;
	if (loss == NULL)
	{
		loss = palloc0(sizeof(LedgerLoss));
		loss->ops = entry->ops;
		loss->reason = reason;
		loss->uncertain = uncertain;
		loss->next = *losses;
		*losses = loss;
	}
	loss->count++;
	for (i = 0; i < loss->npolicies; i++)
		if (strcmp(loss->policies[i], policy) == 0)
			break;
	if (i < loss->npolicies)
		loss->policy_counts[i]++;
	else if (loss->npolicies < LEDGER_LOG_POLICIES)
	{
		loss->policies[loss->npolicies] = pstrdup(policy);
		loss->policy_counts[loss->npolicies++] = 1;
	}
	else
		loss->other_policies++;
}

/* Logs each kind and reason of loss once: a count and the policies, never a subject. */
static void
losses_log(const LedgerLoss *losses)
{
	for (const LedgerLoss *loss = losses; loss != NULL; loss = loss->next)
	{
		StringInfoData policies;
		char	   *line_class = psprintf("%s %s%s", loss->ops->what, loss->reason,
										  loss->uncertain ? " (uncertain)" : "");
		int64		held_back;

		/* Under a long outage every transaction end loses some: one line per retry_interval. */
		if (!log_limit_allow(line_class, breaker_retry_interval_ms, &held_back))
			continue;
		initStringInfo(&policies);
		for (int i = 0; i < loss->npolicies; i++)
			appendStringInfo(&policies, "%s\"%s\" (%d)", i > 0 ? ", " : "",
							 loss->policies[i], loss->policy_counts[i]);
		if (loss->other_policies > 0)
			appendStringInfo(&policies, ", and %d of other policies", loss->other_policies);
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 loss->uncertain ?
				 errmsg("ratelimit: %d %s%s may not have been %s: %s", loss->count,
						loss->ops->what, loss->count == 1 ? "" : "s", loss->ops->given_back,
						loss->reason) :
				 errmsg("ratelimit: %d %s%s not %s: %s", loss->count, loss->ops->what,
						loss->count == 1 ? " was" : "s were", loss->ops->given_back, loss->reason),
				 errdetail("Policies: %s. %s%s", policies.data, loss->ops->if_lost,
						   held_back == 0 ? "" :
						   psprintf(" " INT64_FORMAT " more such lines were not logged since the last one.",
									held_back))));
	}
}

/* Why a call (or the connection) gave no answer, for the log. */
static const char *
loss_reason(const RedisFailure *failure)
{
	switch (failure->kind)
	{
		case REDIS_FAILURE_NONE:
			return "Redis was not asked: it could not be reached shortly before";
		case REDIS_FAILURE_TIMEOUT:
			if (ProcDiePending)
				return "the backend was terminated before Redis answered";
			if (QueryCancelPending)
				return "the backend was cancelled (or its statement timed out) before Redis answered";
			return "Redis did not answer within ratelimit.command_timeout";
		case REDIS_FAILURE_PERMISSION:
			return psprintf("Redis refused it (permission: %s)", failure->detail);
		case REDIS_FAILURE_REPLY:
			return psprintf("Redis refused it (error reply: %s)", failure->detail);
		default:
			return psprintf("Redis could not be used (%s: %s)",
							redis_failure_kind_name(failure->kind), failure->detail);
	}
}

/*
 * Gives back the entries of due (all removed from the ledger already):
 * locally where they can be, else all in one pipeline. Logs what was not
 * given back. Runs in a short-lived
 * context the caller deletes.
 */
static void
ledger_settle(List *due, bool exiting)
{
	int			count = list_length(due);
	RedisCall  *calls = palloc0(count * sizeof(RedisCall));
	LedgerEntry **asked = palloc(count * sizeof(LedgerEntry *));
	const char *url = redis_url_own();
	LedgerLoss *found = NULL;
	ListCell   *cell;
	int			n = 0;

	foreach(cell, due)
	{
		LedgerEntry *entry = lfirst(cell);

		if (entry->ops->settle_locally(entry))
			continue;
		if (strcmp(entry->redis_url, url) != 0)
		{
			loss_add(&found, entry, "ratelimit.redis_url changed since", false);
			continue;
		}
		entry->ops->prepare_call(entry, &calls[n]);
		asked[n++] = entry;
	}
	if (n > 0)
	{
		/* At exit, the server's, if shorter: a session's own must not hold up a shutdown. */
		int			timeout_ms = exiting ?
			Min(deadline_command_timeout_ms, breaker_server_command_timeout_ms()) :
			deadline_command_timeout_ms;
		RedisFailure failure;

		/* Its deadline grows with the entries (deadline_for_calls_us). */
		(void) redis_run_scripts(calls, n, timeout_ms, &failure);
		for (int i = 0; i < n; i++)
		{
			/* Each call's own: kind NONE when its node's breaker skipped it. */
			const RedisFailure *why = &calls[i].failure;

			engine_observe_settle(asked[i]->ops->policy_name(asked[i]), calls[i].answered, why,
								  calls[i].round_trip_us);
			if (calls[i].answered && asked[i]->ops->answered != NULL)
				asked[i]->ops->answered(asked[i]);
			if (!calls[i].answered)
				loss_add(&found, asked[i], loss_reason(why), why->maybe_ran &&
						 why->kind != REDIS_FAILURE_REPLY && why->kind != REDIS_FAILURE_PERMISSION);
		}
	}
	losses_log(found);
}

/* What becomes of entry at moment (from: the subtransaction that rolls back). */
static LedgerFate
ledger_fate(const LedgerEntry *entry, LedgerMoment moment, SubTransactionId from)
{
	switch (moment)
	{
		case LEDGER_SUBXACT_ABORT:
			return !entry->session && entry->subxact >= from ? LEDGER_SETTLE : LEDGER_KEEP;
		case LEDGER_PRE_COMMIT:
			return !entry->session && entry->ends_with_commit ? LEDGER_SETTLE : LEDGER_KEEP;
		case LEDGER_COMMIT:
			return entry->session ? LEDGER_KEEP : LEDGER_FORGET;
		case LEDGER_ABORT:
			return entry->session ? LEDGER_KEEP : LEDGER_SETTLE;
		case LEDGER_DISCARD_ALL:
			return entry->session ? LEDGER_SETTLE : LEDGER_KEEP;
		case LEDGER_EXIT:
			break;
	}
	return LEDGER_SETTLE;
}

/* True when an entry is due to be settled at moment (a commit settles nothing). */
static bool
ledger_any_due(LedgerMoment moment, SubTransactionId from)
{
	ListCell   *cell;

	foreach(cell, entries)
		if (ledger_fate(lfirst(cell), moment, from) == LEDGER_SETTLE)
			return true;
	return false;
}

/* The entries due at moment, listed in context (the list allocates: an error here takes nothing off). */
static List *
ledger_due(LedgerMoment moment, SubTransactionId from, MemoryContext context)
{
	MemoryContext caller_context = MemoryContextSwitchTo(context);
	List	   *due = NIL;
	ListCell   *cell;

	foreach(cell, entries)
		if (ledger_fate(lfirst(cell), moment, from) == LEDGER_SETTLE)
			due = lappend(due, lfirst(cell));
	MemoryContextSwitchTo(caller_context);
	return due;
}

/*
 * Takes everything that ends at moment off the ledger in one pass, the
 * entries kept moving to the front (deleting one cell at a time would shift
 * a long ledger once per entry); what is forgotten is freed.
 */
static void
ledger_take_off(LedgerMoment moment, SubTransactionId from)
{
	ListCell   *cell;
	int			kept = 0;

	foreach(cell, entries)
	{
		LedgerEntry *entry = lfirst(cell);
		LedgerFate	fate = ledger_fate(entry, moment, from);

		if (fate == LEDGER_KEEP)
			lfirst(list_nth_cell(entries, kept++)) = entry;
		else if (fate == LEDGER_FORGET)
			ledger_free(entry);
	}
	if (kept == 0)
	{
		list_free(entries);
		entries = NIL;
	}
	else
		entries = list_truncate(entries, kept);
}

/*
 * Settles or forgets the entries that end at moment; keeps the others. Raises
 * nothing: this runs inside commit and abort processing. Forgetting allocates
 * nothing (a commit settles nothing), so that what commit does after the
 * commit record cannot fail;
 * anything that can fail (an out-of-memory, a wait event set that cannot be
 * made) is caught, logged, and ends the settling, with interrupts held and the
 * hold-off counts as they were.
 */
static void
ledger_close(LedgerMoment moment, SubTransactionId from)
{
	MemoryContext caller_context = CurrentMemoryContext;
	MemoryContext volatile context = NULL;
	List	   *volatile due = NIL;
	uint32		interrupt_holdoff;
	uint32		cancel_holdoff;

	if (entries == NIL)
		return;
	HOLD_INTERRUPTS();
	/* An error resets these (errfinish): they are put back as they were. */
	interrupt_holdoff = InterruptHoldoffCount;
	cancel_holdoff = QueryCancelHoldoffCount;
	PG_TRY();
	{
		ListCell   *cell;

		/* Only what is due allocates: a commit, which settles nothing, allocates nothing. */
		if (ledger_any_due(moment, from))
		{
			context = AllocSetContextCreate(TopMemoryContext, "ratelimit settlement",
											ALLOCSET_DEFAULT_SIZES);
			due = ledger_due(moment, from, context);
		}
		ledger_take_off(moment, from);
		if (due != NIL)
		{
			MemoryContextSwitchTo(context);
			ledger_settle(due, moment == LEDGER_EXIT);
			MemoryContextSwitchTo(caller_context);
			foreach(cell, due)
				ledger_free(lfirst(cell));
		}
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(caller_context);
		InterruptHoldoffCount = interrupt_holdoff;
		QueryCancelHoldoffCount = cancel_holdoff;
		FlushErrorState();
		/* Entries taken off the ledger and not given back are lost (their memory goes with the reset below). */
		ereport(LOG,
				(errhidestmt(true),
				 errhidecontext(true),
				 errmsg("ratelimit: %d reservations or leases may not have been given back: an error interrupted it",
						list_length(due))));
	}
	PG_END_TRY();
	if (context != NULL)
		MemoryContextDelete(context);
	RESUME_INTERRUPTS();
	if (entries == NIL)
		MemoryContextReset(ledger_context);
}

/* Transaction end gives back what is due; PREPARE with entries is refused. */
static void
ledger_xact_callback(XactEvent event, void *arg)
{
	ListCell   *cell;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			/* A prepared transaction can outlive the session that would give them back. */
			foreach(cell, entries)
			{
				LedgerEntry *entry = lfirst(cell);

				if (!entry->session)
					ereport(ERROR,
							(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							 errmsg_internal("%s", entry->ops->prepare_error),
							 entry->ops->prepare_detail ?
							 errdetail_internal("%s", entry->ops->prepare_detail) : 0,
							 errhint("%s", entry->ops->prepare_hint)));
			}
			break;
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
			/* Leases go back before the commit, where an error could still abort it. */
			ledger_close(LEDGER_PRE_COMMIT, InvalidSubTransactionId);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			ledger_close(LEDGER_COMMIT, InvalidSubTransactionId);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			ledger_close(LEDGER_ABORT, InvalidSubTransactionId);
			break;
		default:
			break;
	}
}

/* A subtransaction that commits hands its entries up; one that rolls back gives them back. */
static void
ledger_subxact_callback(SubXactEvent event, SubTransactionId subxact,
						SubTransactionId parent, void *arg)
{
	ListCell   *cell;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		ledger_close(LEDGER_SUBXACT_ABORT, subxact);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(cell, entries)
		{
			LedgerEntry *entry = lfirst(cell);

			if (entry->subxact == subxact)
				entry->subxact = parent;
		}
	}
}

/* Backend exit gives back everything still held. */
static void
ledger_exit_callback(int code, Datum arg)
{
	ledger_close(LEDGER_EXIT, InvalidSubTransactionId);
}

/*
 * DISCARD ALL, which a pooler runs before handing the server connection to
 * another client, gives back the session's entries, as it releases session
 * advisory locks. Called before it runs: it resets every setting, and a
 * session's own ratelimit.redis_url is where its leases are.
 */
void
ledger_discard_all(void)
{
	ledger_close(LEDGER_DISCARD_ALL, InvalidSubTransactionId);
}

/* Registers the transaction callbacks; called once per process from _PG_init. */
void
ledger_init(void)
{
	ledger_context = AllocSetContextCreate(TopMemoryContext, "ratelimit ledger",
										   ALLOCSET_SMALL_SIZES);
	RegisterXactCallback(ledger_xact_callback, NULL);
	RegisterSubXactCallback(ledger_subxact_callback, NULL);
}
