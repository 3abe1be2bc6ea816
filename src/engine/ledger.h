/*
 * ledger.h
 *	  What a transaction or session owes Redis when it ends: the refunds of
 *	  its reservations, the releases of its leases.
 */
#ifndef RL_LEDGER_H
#define RL_LEDGER_H

#include "redis/pipeline.h"

typedef struct LedgerEntry LedgerEntry;

/* How the entries of one kind (reservations, leases) are given back. */
typedef struct LedgerOps
{
	const char *what;			/* "reservation", "lease": for the log */
	const char *given_back;		/* "refunded", "released" */
	const char *if_lost;		/* what becomes of one not given back, a sentence */
	/* Why PREPARE TRANSACTION is refused while one is held: message, detail, hint. */
	const char *prepare_error;
	const char *prepare_detail;
	const char *prepare_hint;
	/* Gives entry back without Redis when it can (a local bucket); true when done. */
	bool		(*settle_locally) (LedgerEntry *entry);
	/* Fills call, in the current (short-lived) memory context. */
	void		(*prepare_call) (LedgerEntry *entry, RedisCall *call);
	/* Redis answered entry's call (optional): what this server remembers follows. */
	void		(*answered) (LedgerEntry *entry);
	const char *(*policy_name) (const LedgerEntry *entry);
	void		(*free) (LedgerEntry *entry);
} LedgerOps;

/* The head of every entry; the kind's own fields follow it. */
struct LedgerEntry
{
	const LedgerOps *ops;
	SubTransactionId subxact;	/* who made it; a commit passes it to the parent */
	bool		session;		/* given back when the session ends, not the transaction */
	bool		ends_with_commit;	/* given back at commit too (a lease), not only on rollback */
	char	   *redis_url;		/* the Redis it lives in */
};

extern void ledger_init(void);
extern MemoryContext ledger_memory(void);
extern LedgerEntry *ledger_add(const LedgerOps *ops, Size size, bool session,
							   bool ends_with_commit);
extern LedgerEntry *ledger_last(void);
extern LedgerEntry *ledger_find_last(bool (*match) (const LedgerEntry *entry, void *arg),
									 void *arg);
extern void ledger_forget(LedgerEntry *entry);
extern void ledger_discard_all(void);

#endif							/* RL_LEDGER_H */
