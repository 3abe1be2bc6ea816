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
 * every key of one call shares a hash tag, so that one node holds them all.
 * The reply must be an array of nresults integers.
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
	/* Set by redis_run_scripts: */
	bool		answered;		/* results hold the script's answer */
	RedisFailure failure;		/* else why not: an error reply, an unexpected reply */
	int64		round_trip_us;	/* the pipeline's, from the first byte sent; -1 if none */
} RedisCall;

extern bool redis_run_scripts(RedisCall *calls, int ncalls, int64 deadline,
							  RedisFailure *failure);

#endif							/* RL_PIPELINE_H */
