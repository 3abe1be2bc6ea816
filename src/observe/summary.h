/*
 * summary.h
 *	  A space-saving summary (observe/summary.c): the subjects with the largest
 *	  weights of two kinds, over two alternating periods, in a fixed number of
 *	  counters. observe/top.c keeps one per policy in shared memory.
 */
#ifndef RL_SUMMARY_H
#define RL_SUMMARY_H

/* Bytes of a subject a summary keeps (a longer one keeps its keyed hash too). */
#define SUMMARY_SUBJECT_BYTES 128
/* Hex digits of a keyed hash (policy/subject.c's subject_hash). */
#define SUMMARY_HASH_CHARS 32

typedef enum SummaryKind
{
	SUMMARY_DENIED,				/* 1 per denial */
	SUMMARY_TAKEN,				/* the cost of each grant that took tokens */
	SUMMARY_KINDS
} SummaryKind;

/* The subject a counter counts. */
typedef struct SummarySubject
{
	int			length;			/* the subject's length */
	int			kept;			/* the bytes of it kept (its first whole characters) */
	char		text[SUMMARY_SUBJECT_BYTES];
	char		hash[SUMMARY_HASH_CHARS + 1];	/* a subject longer than kept: its keyed hash */
} SummarySubject;

/*
 * A summary of `size` counters per half and kind: counters[half][kind][size]
 * (24 bytes each, what a decision scans), then their subjects alike.
 */
typedef struct Summary
{
	int64		period;			/* the number of the period the current half counts */
	int64		total[2][SUMMARY_KINDS];	/* the weight each half has counted */
	int			used[2][SUMMARY_KINDS];
	char		data[FLEXIBLE_ARRAY_MEMBER];
} Summary;

/* A subject's count and error over both halves. */
typedef struct SummaryRow
{
	const SummarySubject *subject;
	int64		count;			/* at most error above its true weight */
	int64		error;
} SummaryRow;

extern Size summary_size(int size);
extern void summary_rotate(Summary *summary, int64 period);
extern void summary_add(Summary *summary, int size, SummaryKind kind, uint64 id,
						const SummarySubject *subject, int64 weight);
extern int	summary_rank(Summary *summary, int size, SummaryKind kind, SummaryRow *rows);

#endif							/* RL_SUMMARY_H */
