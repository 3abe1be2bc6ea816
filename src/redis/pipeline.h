/*
 * pipeline.h
 *	  The script protocol: Lua scripts run by their SHA1, any number of calls
 *	  in one pipeline, each with its own answer.
 */
#ifndef RL_PIPELINE_H
#define RL_PIPELINE_H

#include "base/script.h"
#include "redis/failure.h"

/*
 * One script call of a pipeline. keys and args are NUL-terminated strings;
 * every key of one call shares a hash tag, so that one node holds them all
 * (a Redis Cluster slot: the call goes to the master that owns it). The reply
 * must be an array of nresults integers.
 */
typedef struct RedisCall
{
	const LuaScript *script;
	int			nkeys;
	const char *const *keys;
	int			nargs;
	const char *const *args;
	int			nresults;
	long long  *results;
	int			target;			/* the Redis it runs in: 0 this server's, else a region's (regions.h) */
	/* Set by redis_run_scripts: */
	bool		answered;		/* results hold the script's answer */
	RedisFailure failure;		/* else why not (kind NONE: its node's breaker is open) */
	int64		round_trip_us;	/* from its first byte sent to its answer; -1 if none */
	int64		retry_after_ms; /* until its node is tried again, for a fail mode's retry-after */
	/* The pipeline's own: */
	int			node;			/* where it goes next (cluster.h) */
	bool		done;			/* answered, or failed for good */
	bool		asking;			/* redirected by ASK: ASKING goes before it */
	int			redirects;
	int64		first_sent_us;
} RedisCall;

extern bool pipeline_run(RedisCall *calls, int ncalls, int command_timeout_ms,
						 RedisFailure *failure);
extern bool redis_run_scripts(RedisCall *calls, int ncalls, int command_timeout_ms,
							  RedisFailure *failure);

#endif							/* RL_PIPELINE_H */
