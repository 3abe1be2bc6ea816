/*
 * redis_url.h
 *	  Parsing ratelimit.redis_url.
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

extern bool redis_url_parse(const char *url, RedisUrl *out, const char **problem);

#endif							/* RL_REDIS_URL_H */
