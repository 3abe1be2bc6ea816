/*
 * slices.h
 *	  Slices of hot subjects' tokens held by this server (allowances), in
 *	  shared memory.
 */
#ifndef RL_SLICES_H
#define RL_SLICES_H

#include "algorithm/limit.h"
#include "local/table.h"

/*
 * Longest Redis key a slice remembers: above the longest key there can be
 * (prefix and scope of 64 bytes, "v<version>.<installation>", a subject's
 * tag and rest of 64 bytes each or their hashes, a policy name of 63: about
 * 350 bytes).
 */
#define SLICE_KEY_LEN 512
/* Most give-backs one take of the table hands out: its own and a few expired ones. */
#define SLICE_MAX_GIVEBACKS 4

/* Tokens taken from Redis and not granted, to give back to where they came from. */
typedef struct SliceGiveBack
{
	LimitParams params;
	char		key[SLICE_KEY_LEN]; /* the subject's base key */
	int64		tokens;
	int64		taken_ms;		/* when they were taken: a window's go back to its window */
} SliceGiveBack;

/* One take's question to the table. */
typedef struct SliceAsk
{
	LocalKey	key;			/* the subject in shared memory */
	int64		cost;
	int64		allowance;		/* the most tokens one slice holds */
	int64		ttl_ms;			/* how long a slice may be used */
	const LimitParams *params;
	const char *redis_key;		/* set for slices_install only */
	int64		now_ms;			/* the take's time (a window's: the one it counts in) */
	bool		may_fetch;		/* may fetch a new slice (a batch may not: see slices_take) */
	int64		fetch_ms;		/* the longest such a fetch may take: others wait no longer */
} SliceAsk;

typedef enum SliceOutcome
{
	SLICE_NONE,					/* ask Redis for the cost alone */
	SLICE_GRANTED,				/* granted from the slice */
	SLICE_FETCH,				/* ask Redis for a slice (the ticket says whose) */
	SLICE_WAIT					/* another backend fetches a slice (the ticket says whose) */
} SliceOutcome;

/* What became of a fetched slice. */
typedef enum SliceInstall
{
	SLICE_INSTALLED,
	SLICE_MOVED_ON,				/* another fetch took over, or the slot went: give it back */
	SLICE_DROPPED				/* rl_reset made here meanwhile: its tokens are void */
} SliceInstall;

/* A slice, as a grant from it or its installation reads it. */
typedef struct SliceGrant
{
	int64		left;			/* tokens still in the slice */
	int64		remaining;		/* Redis's remaining when the slice was taken */
	int64		reset_until_ms; /* Redis's reset-after then, on this server's clock */
	int64		usable_from_ms; /* the slice is used from then (a window's start) ... */
	int64		usable_until_ms;	/* ... until then */
	int64		givable_until_ms;	/* what is left is given back until then (a window's end) */
} SliceGrant;

extern SharedTable slices_table;

extern bool slices_available(void);
extern bool slices_grant(const SliceAsk *ask, SliceGrant *grant, bool *alone);
extern SliceOutcome slices_take(const SliceAsk *ask, SliceGrant *grant, uint32 *ticket,
								int64 *want, SliceGiveBack *backs, int *nbacks);
extern SliceInstall slices_install(const SliceAsk *ask, uint32 ticket, int64 taken_ms,
								   const SliceGrant *slice, int64 starved_until_ms);
extern void slices_abandon(const SliceAsk *ask, uint32 ticket, int64 starved_until_ms);
extern void slices_wait(const LocalKey *key, uint32 ticket, int64 now_ms, int timeout_ms);
extern void slices_note(const SliceAsk *ask);
extern void slices_forget(const LocalKey *key);

#endif							/* RL_SLICES_H */
