/*
 * top.h
 *	  The subjects of each policy most denied and most served lately (rl_top),
 *	  in shared memory, per server.
 */
#ifndef RL_TOP_H
#define RL_TOP_H

#include "nodes/pg_list.h"

#include "engine/decision.h"

/* One row of rl_top. */
typedef struct TopRow
{
	const char *kind;			/* "denied" or "taken" */
	int			rank;			/* 1 = the largest count */
	const char *subject;		/* its first bytes (length of them) */
	int			length;
	const char *hash;			/* its keyed hash (rl_subject_hash) */
	int64		count;			/* at most error above its true weight */
	int64		error;
	int64		total;			/* the weight the kind counted in all */
} TopRow;

extern void top_init(bool preloaded);
extern Size top_shmem_size(void);
extern void top_shmem_request(void);
extern void top_shmem_init(void);
extern void top_decision(const Decision *decision, int64 cost, const char *subject, int length);
extern List *top_read(const char *policy);

#endif							/* RL_TOP_H */
