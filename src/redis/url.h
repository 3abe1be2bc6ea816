/*
 * url.h
 *	  ratelimit.redis_url: the setting, and parsing it.
 */
#ifndef RL_REDIS_URL_H
#define RL_REDIS_URL_H

typedef struct RedisUrl
{
	bool		is_unix;
	char	   *host;			/* TCP: host name or IP literal (no brackets) */
	int			port;
	char	   *path;			/* unix socket path */
	char	   *user;			/* NULL: none */
	char	   *password;		/* NULL: no AUTH */
	int			database;
} RedisUrl;

extern void redis_url_init(void);
extern const char *redis_url_current(void);
extern bool redis_url_is_server_wide(void);
extern uint32 redis_url_generation(void);
extern bool redis_url_parse(const char *url, RedisUrl *out, const char **problem);

#endif							/* RL_REDIS_URL_H */
