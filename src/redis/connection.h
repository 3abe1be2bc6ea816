/*
 * redis.h
 *	  Running Lua scripts in Redis, one or a pipeline of them, without ever
 *	  blocking the backend.
 */
#ifndef RL_REDIS_H
#define RL_REDIS_H

/* Why a call got no usable answer; the fail mode then decides. */
typedef enum RedisFailureKind
{
	REDIS_FAILURE_NONE = 0,
	REDIS_FAILURE_CONFIG,		/* ratelimit.redis_url is not set or cannot be used */
	REDIS_FAILURE_CONNECT,		/* could not connect or authenticate */
	REDIS_FAILURE_TIMEOUT,		/* no answer before the deadline */
	REDIS_FAILURE_IO,			/* the connection broke mid-request */
	REDIS_FAILURE_PROTOCOL,		/* an answer that is not what the script returns */
	REDIS_FAILURE_REPLY,		/* Redis answered an error */
	REDIS_FAILURE_PERMISSION	/* Redis refused a command: the ACL does not allow it */
} RedisFailureKind;

#define REDIS_FAILURE_KINDS (REDIS_FAILURE_PERMISSION + 1)

typedef struct RedisFailure
{
	RedisFailureKind kind;
	/* A short class to log (an error's first word, the command refused): never a key or a subject. */
	char		detail[64];
	/* This backend's own trouble (no file descriptor, a name it cannot resolve). */
	bool		backend_only;
	/* The request went out: Redis may have run it although no answer came back. */
	bool		maybe_ran;
} RedisFailure;

/* A script and its SHA1, computed on first use. */
typedef struct RedisScript
{
	const char *name;
	const char *body;
	char		sha1[41];
} RedisScript;

/*
 * One script call of a pipeline. keys and args are NUL-terminated strings;
 * every key of one call shares a hash tag, so that one node holds them all.
 * The reply must be an array of nresults integers.
 */
typedef struct RedisCall
{
	RedisScript *script;
	int			nkeys;
	const char *const *keys;
	int			nargs;
	const char *const *args;
	int			nresults;
	long long  *results;
	/* Set by redis_run_scripts: */
	bool		answered;		/* results hold the script's answer */
	RedisFailure failure;		/* else why not: an error reply, an unexpected reply */
} RedisCall;

/* Microseconds from sending the last call (or pipeline) to its last reply; -1 when none came. */
extern int64 redis_last_round_trip_us;

extern void redis_init(void);
extern bool redis_run_script(RedisScript *script, int nkeys, const char *const *keys,
							 int nargs, const char *const *args,
							 long long *results, int nresults,
							 RedisFailure *failure);
extern bool redis_run_scripts(RedisCall *calls, int ncalls, int64 deadline,
							  RedisFailure *failure);
extern const char *redis_failure_kind_name(RedisFailureKind kind);

#endif							/* RL_REDIS_H */
