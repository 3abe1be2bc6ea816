/*
 * redis.h
 *	  Running a Lua script in Redis for one key, without ever blocking the backend.
 */
#ifndef RL_REDIS_H
#define RL_REDIS_H

/* Why a call got no usable answer; the fail mode then decides. */
typedef enum RedisFailureKind
{
	REDIS_FAILURE_NONE = 0,
	REDIS_FAILURE_CONFIG,		/* ratelimit.redis_url is not set */
	REDIS_FAILURE_CONNECT,		/* could not connect or authenticate */
	REDIS_FAILURE_TIMEOUT,		/* no answer before the deadline */
	REDIS_FAILURE_IO,			/* the connection broke mid-request */
	REDIS_FAILURE_PROTOCOL,		/* an answer that is not what the script returns */
	REDIS_FAILURE_REPLY			/* Redis answered an error */
} RedisFailureKind;

typedef struct RedisFailure
{
	RedisFailureKind kind;
	/* A short class to log: never a key or a subject. */
	char		detail[64];
	/* This backend's own trouble (no file descriptor, a name it cannot resolve). */
	bool		backend_only;
} RedisFailure;

/* A script and its SHA1, computed on first use. */
typedef struct RedisScript
{
	const char *name;
	const char *body;
	char		sha1[41];
} RedisScript;

/* Microseconds from sending the last script call to its reply; -1 when none came. */
extern int64 redis_last_round_trip_us;

extern bool redis_run_script(RedisScript *script, int nkeys, const char *const *keys,
							 int nargs, const char *const *args,
							 long long *results, int nresults,
							 RedisFailure *failure);
extern const char *redis_failure_kind_name(RedisFailureKind kind);

#endif							/* RL_REDIS_H */
