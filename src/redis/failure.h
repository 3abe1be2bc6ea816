/*
 * failure.h
 *	  Why Redis gave no usable answer: the classes the fail modes, the breaker,
 *	  the log and rl_health speak of.
 */
#ifndef RL_REDIS_FAILURE_H
#define RL_REDIS_FAILURE_H

typedef enum RedisFailureKind
{
	REDIS_FAILURE_NONE = 0,
	REDIS_FAILURE_CONFIG,		/* ratelimit.redis_url is not set or cannot be used */
	REDIS_FAILURE_CONNECT,		/* could not connect or authenticate */
	REDIS_FAILURE_TIMEOUT,		/* no answer before the deadline */
	REDIS_FAILURE_IO,			/* the connection broke mid-request */
	REDIS_FAILURE_PROTOCOL,		/* an answer that is not what the script returns */
	REDIS_FAILURE_REPLY,		/* Redis answered an error not named below */
	REDIS_FAILURE_PERMISSION,	/* Redis refused a command: the ACL does not allow it */
	REDIS_FAILURE_TLS,			/* the TLS handshake failed: a certificate, a protocol */
	REDIS_FAILURE_SENTINEL,		/* no sentinel named the master */
	/* The node cannot serve anyone now: */
	REDIS_FAILURE_READONLY,		/* refuses writes: a replica (READONLY, ROLE), or NOREPLICAS */
	REDIS_FAILURE_LOADING,		/* loading its dataset */
	REDIS_FAILURE_MASTERDOWN,	/* a replica that lost its master */
	REDIS_FAILURE_CLUSTERDOWN,	/* a cluster node that says the cluster cannot serve */
	/* The node answers, but not this request: */
	REDIS_FAILURE_BUSY,			/* running a script that does not end */
	REDIS_FAILURE_OOM,			/* over maxmemory */
	REDIS_FAILURE_NOSCRIPT,		/* the script is gone, even after it was sent again */
	REDIS_FAILURE_TRYAGAIN,		/* a cluster slot half moved: its keys on two nodes */
	REDIS_FAILURE_REDIRECT,		/* redirected (MOVED, ASK) more often than a call may be */
	/* Redis wants a password we did not send (NOAUTH), or refused ours (WRONGPASS): */
	REDIS_FAILURE_AUTH,
	/* The script failed on the request's own values (a Lua error): an error, not a fail mode. */
	REDIS_FAILURE_SCRIPT
} RedisFailureKind;

#define REDIS_FAILURE_KINDS (REDIS_FAILURE_SCRIPT + 1)

typedef struct RedisFailure
{
	RedisFailureKind kind;
	/*
	 * A short class to log (an error's first word, the command refused, a
	 * certificate's problem): never a key or a subject.
	 */
	char		detail[128];
	/* This backend's own trouble (no file descriptor, a name it cannot resolve). */
	bool		backend_only;
	/* The request went out: Redis may have run it although no answer came back. */
	bool		maybe_ran;
	/* It came on a connection opened for this very request (Redis drops new ones). */
	bool		new_connection;
	/*
	 * A timeout while Redis was still answering: the deadline of many calls
	 * sent together passed, not a command_timeout without a byte from Redis.
	 */
	bool		answering;
	/* The cluster node it came from, "host:port" ("" when not a cluster). */
	char		node[64];
	/* The Redis it came from: 0 this server's, else a region's (regions.h). */
	int			target;
} RedisFailure;

extern bool redis_fail(RedisFailure *failure, RedisFailureKind kind, const char *detail);
extern void redis_fail_with_error(RedisFailure *failure, const char *text, int length);
extern const char *redis_failure_kind_name(RedisFailureKind kind);
extern bool redis_failure_wrong_node(RedisFailureKind kind);

#endif							/* RL_REDIS_FAILURE_H */
