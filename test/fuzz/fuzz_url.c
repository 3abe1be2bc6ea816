/*
 * fuzz_url.c
 *	  Fuzz target: redis_url_parse on any string never crashes, and what it
 *	  accepts is consistent (one kind of URL, hosts non-empty, ports and
 *	  databases in range, names plain); setting ratelimit.redis_url through
 *	  its hooks accepts exactly what the parser does.
 *
 * The input is the URL (up to its first NUL), in an exact-size heap copy.
 */
#include "prelude.h"

#include <ctype.h>

#include "redis/url.h"

#include "shim.h"

/* True when every character of host may be in a host name or an IPv6 literal. */
static bool
host_is_plain(const char *host)
{
	for (const char *c = host; *c; c++)
		if (!(isalnum((unsigned char) *c) || strchr(".-_:%", *c) != NULL))
			return false;
	return true;
}

/* Checks one node's address: a non-empty plain host, a port in range. */
static void
check_node(const RedisHostPort *node)
{
	FUZZ_CHECK(node->host != NULL && node->host[0] != '\0' && host_is_plain(node->host));
	FUZZ_CHECK(node->port >= 1 && node->port <= 65535);
}

/* True for a name the URL may carry to Redis and to logs (master, sentinel user). */
static bool
name_is_plain(const char *name)
{
	size_t		length = strlen(name);

	return length >= 1 && length <= 64 && strspn(name,
												 "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") == length;
}

/* Checks that an accepted URL is one kind of URL, each part in range. */
static void
check_url(const char *text, const RedisUrl *url)
{
	int			kinds = (url->is_unix ? 1 : 0) + (url->nsentinels > 0 ? 1 : 0) + (url->nseeds > 0 ? 1 : 0);

	FUZZ_CHECK(kinds == 1);
	FUZZ_CHECK(url->database >= 0 && url->database <= 1000000);
	FUZZ_CHECK(url->user == NULL || url->user[0] != '\0');
	FUZZ_CHECK(url->tls == (strncmp(text, "rediss", 6) == 0));
	if (url->is_unix)
	{
		FUZZ_CHECK(url->path != NULL && url->path[0] == '/' && strlen(url->path) >= 2);
		FUZZ_CHECK(!url->tls && url->host == NULL);
	}
	else if (url->nsentinels > 0)
	{
		FUZZ_CHECK(url->nsentinels <= REDIS_MAX_SENTINELS);
		for (int i = 0; i < url->nsentinels; i++)
			check_node(&url->sentinels[i]);
		FUZZ_CHECK(url->master_name != NULL && name_is_plain(url->master_name));
		FUZZ_CHECK(url->sentinel_user == NULL || name_is_plain(url->sentinel_user));
		FUZZ_CHECK(url->host == NULL && url->path == NULL);
	}
	else
	{
		FUZZ_CHECK(url->nseeds <= REDIS_MAX_SEEDS);
		for (int i = 0; i < url->nseeds; i++)
			check_node(&url->seeds[i]);
		FUZZ_CHECK(url->host == url->seeds[0].host && url->port == url->seeds[0].port);
		/* A cluster has only database 0. */
		FUZZ_CHECK(url->nseeds == 1 || url->database == 0);
		FUZZ_CHECK(url->path == NULL && url->master_name == NULL);
	}
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: a URL. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static bool defined = false;
	char	   *text;
	RedisUrl	url;
	const char *problem = NULL;
	bool		parsed;
	uint32		generation;

	if (!defined)
	{
		redis_url_init();
		defined = true;
	}
	shim_begin();
	PG_TRY();
	{
		text = palloc(size + 1);
		memcpy(text, input, size);
		text[size] = '\0';
		text = repalloc(text, strlen(text) + 1);

		parsed = redis_url_parse(text, &url, &problem);
		if (parsed)
			check_url(text, &url);
		else
			FUZZ_CHECK(problem != NULL && problem[0] != '\0');

		/* The setting takes what the parser takes ("" unsets it, and is always taken). */
		generation = redis_url_generation();
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", text) == (parsed || text[0] == '\0'));
		if (parsed || text[0] == '\0')
			FUZZ_CHECK(strcmp(redis_url_current(), text) == 0 && redis_url_generation() != generation);
	}
	PG_CATCH();
	{
		/* An ERROR with an errcode ends the input, as it would end a statement. */
		shim_error_caught();
	}
	PG_END_TRY();
	shim_end();
	return 0;
}
