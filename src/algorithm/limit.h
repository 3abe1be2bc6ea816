/*
 * limit.h
 *	  What every rate-limit algorithm shares: the parameters a policy gives
 *	  it, the state of one subject's limit, what a call does and answers, and
 *	  the dispatch to each algorithm's C model and Redis scripts (limit.c).
 */
#ifndef RL_LIMIT_H
#define RL_LIMIT_H

#include "datatype/timestamp.h"

#include "base/script.h"

/* Largest integer every value of the scripts' math must stay below (Lua numbers are doubles). */
#define BUCKET_EXACT_LIMIT (INT64CONST(1) << 53)
/* Longest idle TTL (about 142,000 years): now + TTL stays below BUCKET_EXACT_LIMIT. */
#define BUCKET_MAX_TTL_MS (INT64CONST(1) << 52)

/* The algorithm column. */
typedef enum Algorithm
{
	ALGORITHM_TOKEN_BUCKET,
	ALGORITHM_CONCURRENCY,
	ALGORITHM_GCRA,
	ALGORITHM_FIXED_WINDOW,
	ALGORITHM_SLIDING_WINDOW,
	ALGORITHM_SLIDING_LOG
} Algorithm;

/* A window that starts at a calendar boundary in the policy's time zone, or none. */
typedef enum WindowCalendar
{
	CALENDAR_NONE,				/* aligned to the epoch */
	CALENDAR_SECOND,
	CALENDAR_MINUTE,
	CALENDAR_HOUR,
	CALENDAR_DAY,
	CALENDAR_WEEK,
	CALENDAR_MONTH,
	CALENDAR_YEAR
} WindowCalendar;

/* Longest time zone name a policy may give (the table's constraint says the same). */
#define LIMIT_ZONE_LEN 64

/*
 * One limit's parameters. Refilling algorithms (token bucket, GCRA): one token
 * is `unit` units and one millisecond adds `rate` units, from refill_amount /
 * refill_period reduced by their gcd, so refill is exact. Window algorithms:
 * at most `capacity` per window of window_ms (or per calendar unit).
 */
typedef struct LimitParams
{
	Algorithm	algorithm;
	int64		capacity;		/* tokens */
	int64		unit;			/* units per token (refilling algorithms) */
	int64		rate;			/* units added per millisecond (refilling algorithms) */
	int64		capacity_units; /* capacity * unit */
	int64		ttl_ms;			/* idle TTL of the Redis key (0: the algorithm's own) */
	int64		window_ms;		/* window algorithms: the window, when not a calendar unit */
	WindowCalendar calendar;
	char		time_zone[LIMIT_ZONE_LEN];	/* a calendar window's zone */
	int64		rollover;		/* fixed window: most unused tokens carried on (0: none) */
} LimitParams;

/* The most tokens a sliding log kept in C (a local fallback slot) holds: one time each. */
#define LIMIT_LOG_TOKENS 8

/*
 * One subject's stored state, as the C models keep it (local fallback): the
 * token bucket's level (units) and time of last write; GCRA's theoretical
 * arrival time (level, in units: ms * rate); a window's count (level), its
 * start (last_ms) and the previous window's count (previous); a sliding
 * log's entries (level of them, oldest first, in log).
 */
typedef struct SubjectState
{
	int64		level;
	int64		last_ms;
	int64		previous;
	int64		log[LIMIT_LOG_TOKENS];
} SubjectState;

/* What a call does to a limit: one script each. */
typedef enum LimitMode
{
	LIMIT_TAKE,				/* take cost tokens if they are all there */
	LIMIT_PEEK,				/* the same decision, nothing taken */
	LIMIT_REFUND,				/* give cost tokens back, never above capacity */
	LIMIT_SLICE,				/* take cost and more, up to a most, for an allowance */
	LIMIT_BOOK,					/* take cost, or book the earliest time it fits (a wait) */
	LIMIT_OWE					/* take cost even beyond what is there (a settle) */
} LimitMode;

/* What a call answers: the script's reply. */
typedef struct LimitResult
{
	bool		allowed;
	int64		remaining;		/* whole tokens */
	int64		retry_after_ms;
	int64		reset_after_ms;
} LimitResult;

/* A window: [start_ms, end_ms). */
typedef struct LimitWindow
{
	int64		start_ms;
	int64		end_ms;
} LimitWindow;

/*
 * Most keys and numbers one check sends: a window's two keys, a refund's
 * mark and the request it forgets; a fixed window's booking names two
 * windows (8 numbers), then its wait and debt.
 */
#define LIMIT_MAX_KEYS 4
#define LIMIT_MAX_ARGS 10

/* One check's script, keys and numbers: one call of its own, or one part of a group. */
typedef struct LimitCall
{
	const LuaScript *script;
	int			nkeys;
	const char *keys[LIMIT_MAX_KEYS];
	int			nargs;			/* after the clock */
	const char *args[LIMIT_MAX_ARGS];
	bool		answers_limit;	/* a 5th number follows the four: the window's limit */
	int			tag;			/* its tag in the group script, when not its algorithm's */
} LimitCall;

/*
 * One algorithm: its C model (the local fallback decides with it) and how a
 * check of it is sent to Redis. Each algorithm's file defines one; limit.c
 * dispatches to them.
 */
typedef struct LimitOps
{
	int			tag;			/* the group script's number for this algorithm */
	/* A call of its own (mode's script); key is the subject's base key. */
	void		(*call) (const LimitParams *params, LimitMode mode, const char *key,
						 int64 cost, int64 at_ms, const char *refund_mark, LimitCall *call);
	/* Its keys and numbers in the group script (after its tag). */
	void		(*group_part) (const LimitParams *params, const char *key, int64 cost,
							   int64 at_ms, LimitCall *part);
	/* The keys rl_reset deletes; returns how many. */
	int			(*reset_keys) (const LimitParams *params, const char *key, int64 at_ms,
							   const char **keys);
	void		(*state_new) (const LimitParams *params, SubjectState *state, int64 now_ms);
	void		(*apply) (const LimitParams *params, SubjectState *state, int64 now_ms,
						  int64 cost, LimitMode mode, LimitResult *result);
	bool		(*is_idle) (const LimitParams *params, const SubjectState *state, int64 now_ms);
	/* A state that holds tokens (a local bucket whose parameters changed). */
	void		(*state_holding) (const LimitParams *params, SubjectState *state,
								  int64 now_ms, int64 tokens);
	int64		(*full_ms) (const LimitParams *params);	/* empty to full, at most */
} LimitOps;

extern Algorithm limit_algorithm(const char *name);
extern const char *limit_algorithm_name(Algorithm algorithm);
extern bool limit_refills(Algorithm algorithm);
extern bool limit_slices(Algorithm algorithm);
extern bool limit_books(Algorithm algorithm);
extern int64 limit_booked_at_ms(const LimitParams *params, int64 at_ms);
extern bool limit_params_init(LimitParams *params, Algorithm algorithm, int64 capacity,
							  int64 refill_amount, const Interval *period,
							  int64 idle_ttl_ms, const char *time_zone);
extern const LimitOps *limit_ops(const LimitParams *params);
extern bool limit_answers_limit(const LimitParams *params, LimitMode mode);
extern const LuaScript *limit_group_script(void);
extern void limit_give_back_call(const LimitParams *params, const char *key, int64 tokens,
								 int64 taken_ms, LimitCall *call);
extern void limit_reset_call(const LimitParams *params, const char *key, int64 at_ms,
							 LimitCall *call);

#endif							/* RL_LIMIT_H */
