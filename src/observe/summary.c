/*
 * summary.c
 *	  A space-saving summary (Metwally, Agrawal and El Abbadi, 2005): for each
 *	  kind, `size` counters of the subjects with the largest weights.
 *
 * A subject already counted adds its weight; a new one takes a free counter, else
 * the smallest, whose count it inherits as its error. So the counts add up to the
 * weight N seen, the smallest is at most N / size, each count overstates its
 * subject's weight by at most its error (<= N / size), and a subject missing
 * weighs at most N / size. Two halves count alternate periods; a ranking adds the
 * last whole period to the current one, the bound still holding (a full half that
 * lacks a subject adds its smallest count to the subject's count and error).
 * The caller holds whatever lock guards the summary.
 */
#include "prelude.h"

#include "observe/summary.h"

typedef struct Counter
{
	uint64		id;
	int64		count;
	int64		error;
} Counter;

static Size
counters_size(int size)
{
	return MAXALIGN((Size) 2 * SUMMARY_KINDS * size * sizeof(Counter));
}

/* The bytes of a summary of size counters per half and kind. */
Size
summary_size(int size)
{
	return MAXALIGN(offsetof(Summary, data) + counters_size(size) +
					(Size) 2 * SUMMARY_KINDS * size * sizeof(SummarySubject));
}

static Counter *
counters_of(Summary *summary, int size, int half, SummaryKind kind)
{
	return (Counter *) summary->data + ((Size) half * SUMMARY_KINDS + kind) * size;
}

static SummarySubject *
subjects_of(Summary *summary, int size, int half, SummaryKind kind)
{
	return (SummarySubject *) (summary->data + counters_size(size)) +
		((Size) half * SUMMARY_KINDS + kind) * size;
}

/*
 * Moves summary on to period: the half of the period just over stays, any
 * other is cleared. A caller that read the clock just before another moved
 * it on counts in the current half; only a clock stepped back further
 * starts over.
 */
void
summary_rotate(Summary *summary, int64 period)
{
	if (period == summary->period || period == summary->period - 1)
		return;
	for (int half = 0; half < 2; half++)
	{
		if (period == summary->period + 1 && half == (int) (summary->period % 2))
			continue;
		for (int kind = 0; kind < SUMMARY_KINDS; kind++)
		{
			summary->total[half][kind] = 0;
			summary->used[half][kind] = 0;
		}
	}
	summary->period = period;
}

/* Adds weight to the subject (id) in one kind's counters of the current half. */
void
summary_add(Summary *summary, int size, SummaryKind kind, uint64 id,
			const SummarySubject *subject, int64 weight)
{
	int			half = (int) (summary->period % 2);
	Counter    *counters = counters_of(summary, size, half, kind);
	int			used = summary->used[half][kind];
	int			slot = 0;
	int64		inherited = 0;

	summary->total[half][kind] += weight;
	for (int i = 0; i < used; i++)
	{
		if (counters[i].id == id)
		{
			counters[i].count += weight;
			return;
		}
		if (counters[i].count < counters[slot].count)
			slot = i;
	}
	if (used < size)
		slot = summary->used[half][kind]++;
	else
		inherited = counters[slot].count;	/* the smallest gives way */
	counters[slot].id = id;
	counters[slot].count = inherited + weight;
	counters[slot].error = inherited;
	subjects_of(summary, size, half, kind)[slot] = *subject;
}

static int
row_order(const void *a, const void *b)
{
	const SummaryRow *x = a;
	const SummaryRow *y = b;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	return x->error < y->error ? -1 : x->error > y->error ? 1 : 0;
}

/*
 * Fills rows (room for 2 * size) with one kind's subjects over both halves,
 * largest count first; returns how many to show (at most size). Where a full
 * half lacks a subject, that half's smallest count is its most there (added
 * to count and error); a half not full counted all it saw.
 */
int
summary_rank(Summary *summary, int size, SummaryKind kind, SummaryRow *rows)
{
	int64		floor[2];
	int			nrows = 0;

	for (int half = 0; half < 2; half++)
	{
		Counter    *counters = counters_of(summary, size, half, kind);
		int			used = summary->used[half][kind];

		floor[half] = 0;
		if (used == size)
		{
			floor[half] = counters[0].count;
			for (int i = 1; i < used; i++)
				floor[half] = Min(floor[half], counters[i].count);
		}
	}
	for (int half = 0; half < 2; half++)
	{
		Counter    *counters = counters_of(summary, size, half, kind);
		Counter    *other = counters_of(summary, size, 1 - half, kind);

		for (int i = 0; i < summary->used[half][kind]; i++)
		{
			int			found = -1;

			for (int j = 0; j < summary->used[1 - half][kind]; j++)
				if (other[j].id == counters[i].id)
					found = j;
			/* A subject in both halves is made a row once, from the first. */
			if (found >= 0 && half == 1)
				continue;
			rows[nrows].subject = &subjects_of(summary, size, half, kind)[i];
			rows[nrows].count = counters[i].count + (found >= 0 ? other[found].count : floor[1 - half]);
			rows[nrows].error = counters[i].error + (found >= 0 ? other[found].error : floor[1 - half]);
			nrows++;
		}
	}
	qsort(rows, nrows, sizeof(SummaryRow), row_order);
	return Min(nrows, size);
}
