/*
 * url.c
 *	  ratelimit.redis_url: the setting, and parsing it:
 *	    redis://[user[:password]@]host[:port][/db]
 *	    unix://[user[:password]@]/path/to/socket[?db=N]
 *	  user and password may be percent-encoded; an IPv6 host is written [::1].
 *
 * The value is checked when it is set, not when it is first used, and a URL
 * that carries a password only where other roles cannot read it (secret.c).
 * Whether it was set for the whole server (configuration file, command line,
 * ALTER SYSTEM) decides which breaker its Redis gets.
 */
#include "prelude.h"

#include <ctype.h>

#include "utils/guc.h"

#include "base/secret.h"
#include "redis/url.h"

#define REDIS_DEFAULT_PORT 6379
#define REDIS_MAX_DATABASE 1000000

static char *url_setting = NULL;
/* Whether the value was set for the whole server; a count of its changes. */
static bool url_server_wide = true;
static uint32 url_changes = 0;

/* Value of one hex digit, or -1. */
static int
hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* A palloc'd, percent-decoded copy of text[0..length), or NULL if malformed. */
static char *
percent_decode(const char *text, int length)
{
	char	   *out = palloc(length + 1);
	int			n = 0;

	for (int i = 0; i < length; i++)
	{
		if (text[i] == '%')
		{
			int			high,
						low;

			if (i + 2 >= length)
				return NULL;
			high = hex_value(text[i + 1]);
			low = hex_value(text[i + 2]);
			if (high < 0 || low < 0 || (high == 0 && low == 0))
				return NULL;
			out[n++] = (char) (high * 16 + low);
			i += 2;
		}
		else
			out[n++] = text[i];
	}
	out[n] = '\0';
	return out;
}

/* Parses a whole decimal number in [min, max]; false if it is not one. */
static bool
parse_number(const char *text, int length, int min, int max, int *out)
{
	long		value = 0;

	if (length <= 0 || length > 9)
		return false;
	for (int i = 0; i < length; i++)
	{
		if (text[i] < '0' || text[i] > '9')
			return false;
		value = value * 10 + (text[i] - '0');
	}
	if (value < min || value > max)
		return false;
	*out = (int) value;
	return true;
}

/* Splits "user[:password]" (before an "@") into out->user and out->password. */
static bool
parse_userinfo(const char *text, int length, RedisUrl *out)
{
	const char *colon = memchr(text, ':', length);

	if (colon == NULL)
	{
		/* Like redis-cli, a lone value is the password (the "default" user). */
		out->password = percent_decode(text, length);
		return out->password != NULL && out->password[0] != '\0';
	}
	if (colon > text)
	{
		out->user = percent_decode(text, colon - text);
		if (out->user == NULL)
			return false;
	}
	out->password = percent_decode(colon + 1, length - (colon - text) - 1);
	return out->password != NULL;
}

/*
 * Parses url into out (strings palloc'd in the current context). On failure
 * returns false and points problem at a sentence saying what is wrong.
 */
bool
redis_url_parse(const char *url, RedisUrl *out, const char **problem)
{
	const char *rest;
	const char *at;
	const char *end;

	memset(out, 0, sizeof(*out));
	out->port = REDIS_DEFAULT_PORT;

	if (strncmp(url, "redis://", 8) == 0)
		rest = url + 8;
	else if (strncmp(url, "unix://", 7) == 0)
	{
		out->is_unix = true;
		rest = url + 7;
	}
	else
	{
		*problem = "The URL must start with redis:// or unix://.";
		return false;
	}

	/*
	 * userinfo: for redis:// it ends at the last "@" before the path, so an
	 * unencoded "@" in a password still works; for unix:// it is whatever comes
	 * before the socket's absolute path.
	 */
	at = NULL;
	if (out->is_unix)
	{
		if (*rest != '/')
			at = strstr(rest, "@/");
	}
	else
	{
		end = rest + strcspn(rest, "/?");
		for (const char *p = rest; p < end; p++)
			if (*p == '@')
				at = p;
	}
	if (at != NULL)
	{
		if (!parse_userinfo(rest, at - rest, out))
		{
			*problem = "The user or password part is malformed.";
			return false;
		}
		rest = at + 1;
	}

	if (out->is_unix)
	{
		const char *query = strchr(rest, '?');
		int			path_length = query ? query - rest : (int) strlen(rest);

		if (path_length < 2 || rest[0] != '/')
		{
			*problem = "A unix:// URL needs an absolute socket path, as in unix:///run/redis/redis.sock.";
			return false;
		}
		out->path = pnstrdup(rest, path_length);
		if (query != NULL)
		{
			if (strncmp(query, "?db=", 4) != 0 ||
				!parse_number(query + 4, strlen(query + 4), 0, REDIS_MAX_DATABASE, &out->database))
			{
				*problem = "The only query parameter is ?db=N, with N a database number.";
				return false;
			}
		}
		return true;
	}

	/* host: an IPv6 literal in brackets, or everything up to ":" or "/". */
	if (*rest == '[')
	{
		const char *close = strchr(rest, ']');

		if (close == NULL || close == rest + 1)
		{
			*problem = "An IPv6 address must be written in brackets, as in redis://[::1]:6379.";
			return false;
		}
		out->host = pnstrdup(rest + 1, close - rest - 1);
		rest = close + 1;
	}
	else
	{
		int			host_length = strcspn(rest, ":/?");

		if (host_length == 0)
		{
			*problem = "The URL names no host.";
			return false;
		}
		out->host = pnstrdup(rest, host_length);
		rest += host_length;
	}
	for (const char *p = out->host; *p; p++)
		if (!(isalnum((unsigned char) *p) || *p == '.' || *p == '-' || *p == '_' || *p == ':' || *p == '%'))
		{
			*problem = "The host name holds a character that no host name has.";
			return false;
		}

	if (*rest == ':')
	{
		int			port_length = strcspn(rest + 1, "/?");

		if (!parse_number(rest + 1, port_length, 1, 65535, &out->port))
		{
			*problem = "The port must be a number from 1 to 65535.";
			return false;
		}
		rest += 1 + port_length;
	}
	if (*rest == '/' && rest[1] != '\0')
	{
		if (!parse_number(rest + 1, strlen(rest + 1), 0, REDIS_MAX_DATABASE, &out->database))
		{
			*problem = "The path of a redis:// URL is the database number, as in redis://host:6379/2.";
			return false;
		}
		rest += strlen(rest);
	}
	else if (*rest == '/')
		rest++;
	if (*rest != '\0')
	{
		*problem = "The URL has unexpected text after the host and port.";
		return false;
	}
	return true;
}

/* Rejects a malformed ratelimit.redis_url, or one with a password where others could read it. */
static bool
check_redis_url(char **newval, void **extra, GucSource source)
{
	RedisUrl	url;
	const char *problem;
	GucSource  *where;

	if (*newval != NULL && (*newval)[0] != '\0')
	{
		if (!redis_url_parse(*newval, &url, &problem))
		{
			/* Never echo the value: it may hold a password. */
			GUC_check_errmsg("invalid value for parameter \"ratelimit.redis_url\"");
			GUC_check_errdetail("%s", problem);
			GUC_check_errhint("Use redis://[user[:password]@]host[:port][/db] or unix://[user[:password]@]/path/to/socket[?db=N].");
			return false;
		}
		if (url.password != NULL && !secret_source_allowed("ratelimit.redis_url", source))
		{
			secret_refused("ratelimit.redis_url", source);
			return false;
		}
	}

	/*
	 * The value carries where it was set from, for assign_redis_url. guc.c
	 * frees an extra with free(), so it comes from malloc (guc_malloc is 16+).
	 */
	where = malloc(sizeof(GucSource));
	if (where == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		return false;
	}
	*where = source;
	*extra = where;
	return true;
}

/*
 * A new URL may mean another Redis: its breaker is chosen again, the shared
 * one belonging to the URL set for the whole server.
 */
static void
assign_redis_url(const char *newval, void *extra)
{
	if (newval != NULL && newval[0] != '\0')
		secret_accepted("ratelimit.redis_url");
	url_server_wide = extra != NULL && *(GucSource *) extra <= PGC_S_GLOBAL;
	url_changes++;
}

/* Defines ratelimit.redis_url; called once per process from _PG_init, after secret_init. */
void
redis_url_init(void)
{
	DefineCustomStringVariable("ratelimit.redis_url",
							   "Redis to keep buckets in: redis://[user[:password]@]host[:port][/db] or unix:///path[?db=N].",
							   "Only superusers can read or set it: it may hold a password.",
							   &url_setting, "", PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE,
							   check_redis_url, assign_redis_url, NULL);
}

/* The URL now ("" when unset). */
const char *
redis_url_current(void)
{
	return url_setting ? url_setting : "";
}

/* True when the URL now was set for the whole server, not by a session, role or database. */
bool
redis_url_is_server_wide(void)
{
	return url_server_wide;
}

/* A number that changes whenever the URL does. */
uint32
redis_url_generation(void)
{
	return url_changes;
}
