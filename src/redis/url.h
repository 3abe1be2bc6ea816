/*
 * url.h
 *	  ratelimit.redis_url: the setting, and parsing it.
 */
#ifndef RL_REDIS_URL_H
#define RL_REDIS_URL_H

/* The most sentinels, or cluster nodes to start from, one URL may name. */
#define REDIS_MAX_SENTINELS 16
#define REDIS_MAX_SEEDS 16
/* The Redis servers a backend sends to: its own and up to 8 regions' (regions.h). */
#define REDIS_MAX_TARGETS 9

typedef struct RedisHostPort
{
	char	   *host;			/* host name or IP literal (no brackets) */
	int			port;
} RedisHostPort;

typedef struct RedisUrl
{
	bool		is_unix;
	bool		tls;			/* rediss:// or rediss-sentinel:// */
	char	   *host;			/* TCP: the (first) node; a Sentinel URL: none (the master is found) */
	int			port;
	/* TCP: the nodes named, host and port first; more than one: cluster nodes to start from */
	int			nseeds;
	RedisHostPort seeds[REDIS_MAX_SEEDS];
	char	   *path;			/* unix socket path */
	char	   *user;			/* NULL: none */
	char	   *password;		/* NULL: no AUTH */
	int			database;
	/* A Sentinel URL: nsentinels > 0 */
	int			nsentinels;
	RedisHostPort sentinels[REDIS_MAX_SENTINELS];
	char	   *master_name;
	char	   *sentinel_user;	/* NULL: AUTH to sentinels with the password alone */
} RedisUrl;

extern void redis_url_init(void);
extern const char *redis_url_current(void);
extern const char *redis_url_own(void);
extern bool redis_url_is_server_wide(void);
extern uint32 redis_url_generation(void);
extern void redis_url_use_target(int target, const char *url, uint32 changes);
extern int	redis_url_target(void);
extern bool redis_url_parse(const char *url, RedisUrl *out, const char **problem);

#endif							/* RL_REDIS_URL_H */
