/*
 * url.c
 *	  ratelimit.redis_url: the setting, and parsing it:
 *	    redis://[user[:password]@]host[:port][,host[:port]...][/db]
 *	    rediss://[user[:password]@]host[:port][,host[:port]...][/db] (TLS)
 *	    redis-sentinel://[user[:password]@]host[:port][,host[:port]...]/master[?db=N&sentinel_user=NAME]
 *	    rediss-sentinel://...                                      (TLS to sentinels and nodes)
 *	    unix://[user[:password]@]/path/to/socket[?db=N]
 *	  user and password (the data nodes') may be percent-encoded; an IPv6 host
 *	  is written [::1]. A Sentinel URL names the sentinels to ask for the
 *	  master; their own password is in
 *	  ratelimit.sentinel_password_file.
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
#define REDIS_SENTINEL_DEFAULT_PORT 26379
#define REDIS_MAX_DATABASE 1000000

static char *url_setting = NULL;
/* Whether the value was set for the whole server; a count of its changes. */
static bool url_server_wide = true;
static uint32 url_changes = 0;
/* The Redis the calls go to now: target 0, the URL above, or a region's (regions.c). */
static int	url_target = 0;
static const char *target_url = NULL;
static uint32 target_changes = 0;

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

/* Splits "user", "user:password" or ":password" (before an "@") into out->user and out->password. */
static bool
parse_userinfo(const char *text, int length, RedisUrl *out)
{
	const char *colon = memchr(text, ':', length);

	if (colon == NULL)
	{
		/*
		 * A lone value is the user: its password comes from
		 * ratelimit.redis_password_file, where other roles cannot read it.
		 * (A password alone is written ":secret@", the "default" user's.)
		 */
		out->user = percent_decode(text, length);
		return out->user != NULL && out->user[0] != '\0';
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
 * Parses "host[:port]" (an IPv6 host in brackets) at *rest, up to one of
 * stops or the end, into host and port (default_port when none is given),
 * moving *rest past it. False, with problem set, when it is malformed.
 */
static bool
parse_host_port(const char **rest, const char *stops, int default_port, char **host, int *port,
				const char **problem)
{
	const char *p = *rest;

	if (*p == '[')
	{
		const char *close = strchr(p, ']');

		if (close == NULL || close == p + 1)
		{
			*problem = "An IPv6 address must be written in brackets, as in redis://[::1]:6379.";
			return false;
		}
		*host = pnstrdup(p + 1, close - p - 1);
		p = close + 1;
	}
	else
	{
		int			host_length = 0;

		while (p[host_length] != '\0' && p[host_length] != ':' &&
			   strchr(stops, p[host_length]) == NULL)
			host_length++;
		if (host_length == 0)
		{
			*problem = "The URL names no host.";
			return false;
		}
		*host = pnstrdup(p, host_length);
		p += host_length;
	}
	for (const char *c = *host; *c; c++)
		if (!(isalnum((unsigned char) *c) || *c == '.' || *c == '-' || *c == '_' || *c == ':' || *c == '%'))
		{
			*problem = "The host name holds a character that no host name has.";
			return false;
		}
	*port = default_port;
	if (*p == ':')
	{
		int			port_length = 0;

		p++;
		while (p[port_length] != '\0' && strchr(stops, p[port_length]) == NULL)
			port_length++;
		if (!parse_number(p, port_length, 1, 65535, port))
		{
			*problem = "The port must be a number from 1 to 65535.";
			return false;
		}
		p += port_length;
	}
	*rest = p;
	return true;
}

/* True for a name that is safe to send and to log: letters, digits, "_", "." and "-". */
static bool
is_plain_name(const char *text, int length)
{
	if (length < 1 || length > 64)
		return false;
	for (int i = 0; i < length; i++)
		if (!(isalnum((unsigned char) text[i]) || text[i] == '_' || text[i] == '.' || text[i] == '-'))
			return false;
	return true;
}

/*
 * Parses the query of a Sentinel URL, "?db=N&sentinel_user=NAME" (each
 * optional, in any order), into out.
 */
static bool
parse_sentinel_query(const char *query, RedisUrl *out, const char **problem)
{
	const char *p = query;

	while (*p != '\0')
	{
		int			length = strcspn(p, "&");
		bool		ok = false;

		if (strncmp(p, "db=", 3) == 0)
			ok = parse_number(p + 3, length - 3, 0, REDIS_MAX_DATABASE, &out->database);
		else if (strncmp(p, "sentinel_user=", 14) == 0 && is_plain_name(p + 14, length - 14))
		{
			out->sentinel_user = pnstrdup(p + 14, length - 14);
			ok = true;
		}
		if (!ok)
		{
			*problem = "The query parameters of a Sentinel URL are db=N and sentinel_user=NAME.";
			return false;
		}
		p += length;
		if (*p == '&')
			p++;
	}
	return true;
}

/* The URL schemes, and what each says about the connection. */
static const struct
{
	const char *prefix;
	bool		tls;
	bool		sentinel;
	bool		is_unix;
}			schemes[] = {
	{"redis://", false, false, false},
	{"rediss://", true, false, false},
	{"redis-sentinel://", false, true, false},
	{"rediss-sentinel://", true, true, false},
	{"unix://", false, false, true},
};

/*
 * Parses "host:port[,host:port...]" at *rest into hosts (at most max, each
 * port default_port unless given), moving *rest past it; too_many is the
 * problem when there are more.
 */
static bool
parse_host_list(const char **rest, RedisHostPort *hosts, int *count, int max, int default_port,
				const char *too_many, const char **problem)
{
	for (;;)
	{
		RedisHostPort *host;

		if (*count == max)
		{
			*problem = too_many;
			return false;
		}
		host = &hosts[(*count)++];
		if (!parse_host_port(rest, ",/?", default_port, &host->host, &host->port, problem))
			return false;
		if (**rest != ',')
			return true;
		(*rest)++;
	}
}

/*
 * The userinfo at the start of rest, if any, into out; *after is what
 * follows it. For a network URL it ends at the last "@" before the path, so
 * an unencoded "@" in a password still works; for unix:// it is whatever
 * comes before the socket's absolute path.
 */
static bool
parse_userinfo_part(const char *rest, RedisUrl *out, const char **after, const char **problem)
{
	const char *at = NULL;

	if (out->is_unix)
	{
		if (*rest != '/')
			at = strstr(rest, "@/");
	}
	else
	{
		const char *end = rest + strcspn(rest, "/?");

		for (const char *p = rest; p < end; p++)
			if (*p == '@')
				at = p;
	}
	*after = rest;
	if (at == NULL)
		return true;
	if (!parse_userinfo(rest, at - rest, out))
	{
		*problem = "The user or password part is malformed.";
		return false;
	}
	*after = at + 1;
	return true;
}

/* A unix:// URL after its userinfo: /socket/path[?db=N]. */
static bool
parse_unix_rest(const char *rest, RedisUrl *out, const char **problem)
{
	const char *query = strchr(rest, '?');
	int			path_length = query ? query - rest : (int) strlen(rest);

	if (path_length < 2 || rest[0] != '/')
	{
		*problem = "A unix:// URL needs an absolute socket path, as in unix:///run/redis/redis.sock.";
		return false;
	}
	out->path = pnstrdup(rest, path_length);
	if (query != NULL &&
		(strncmp(query, "?db=", 4) != 0 ||
		 !parse_number(query + 4, strlen(query + 4), 0, REDIS_MAX_DATABASE, &out->database)))
	{
		*problem = "The only query parameter is ?db=N, with N a database number.";
		return false;
	}
	return true;
}

/* A Sentinel URL after its userinfo: host:port[,host:port...]/master-name[?db=N&sentinel_user=NAME]. */
static bool
parse_sentinel_rest(const char *rest, RedisUrl *out, const char **problem)
{
	const char *name;
	int			name_length;

	if (!parse_host_list(&rest, out->sentinels, &out->nsentinels, REDIS_MAX_SENTINELS,
						 REDIS_SENTINEL_DEFAULT_PORT, "A Sentinel URL names at most 16 sentinels.",
						 problem))
		return false;
	if (*rest != '/')
	{
		*problem = "A Sentinel URL names its master after the sentinels, as in redis-sentinel://host:26379/mymaster.";
		return false;
	}
	name = rest + 1;
	name_length = strcspn(name, "?");
	if (!is_plain_name(name, name_length))
	{
		*problem = "The master name must be 1 to 64 letters, digits, \"_\", \".\" or \"-\".";
		return false;
	}
	out->master_name = pnstrdup(name, name_length);
	out->host = NULL;
	rest = name + name_length;
	return *rest != '?' || parse_sentinel_query(rest + 1, out, problem);
}

/* A redis:// or rediss:// URL after its userinfo: host:port[,host:port...][/db]. */
static bool
parse_network_rest(const char *rest, RedisUrl *out, const char **problem)
{
	if (!parse_host_list(&rest, out->seeds, &out->nseeds, REDIS_MAX_SEEDS, REDIS_DEFAULT_PORT,
						 "A URL names at most 16 cluster nodes.", problem))
		return false;
	out->host = out->seeds[0].host;
	out->port = out->seeds[0].port;
	if (*rest == '/' && rest[1] != '\0')
	{
		if (!parse_number(rest + 1, strlen(rest + 1), 0, REDIS_MAX_DATABASE, &out->database))
		{
			*problem = "The path of a redis:// URL is the database number, as in redis://host:6379/2.";
			return false;
		}
		if (out->nseeds > 1 && out->database != 0)
		{
			*problem = "A Redis Cluster has only database 0.";
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

/*
 * Parses url into out (strings palloc'd in the current context). On failure
 * returns false and points problem at a sentence saying what is wrong.
 */
bool
redis_url_parse(const char *url, RedisUrl *out, const char **problem)
{
	const char *rest = NULL;
	bool		sentinel = false;

	memset(out, 0, sizeof(*out));
	out->port = REDIS_DEFAULT_PORT;
	for (int i = 0; i < (int) lengthof(schemes) && rest == NULL; i++)
	{
		if (strncmp(url, schemes[i].prefix, strlen(schemes[i].prefix)) != 0)
			continue;
		rest = url + strlen(schemes[i].prefix);
		out->tls = schemes[i].tls;
		out->is_unix = schemes[i].is_unix;
		sentinel = schemes[i].sentinel;
	}
	if (rest == NULL)
	{
		*problem = "The URL must start with redis://, rediss://, redis-sentinel://, rediss-sentinel:// or unix://.";
		return false;
	}
	if (!parse_userinfo_part(rest, out, &rest, problem))
		return false;
	if (out->is_unix)
		return parse_unix_rest(rest, out, problem);
	if (sentinel)
		return parse_sentinel_rest(rest, out, problem);
	return parse_network_rest(rest, out, problem);
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
			GUC_check_errhint("Use redis://[user[:password]@]host[:port][,host[:port]...][/db] (rediss:// for TLS), redis-sentinel://[user[:password]@]host[:port][,host[:port]...]/master[?db=N] (rediss-sentinel:// for TLS), or unix://[user[:password]@]/path/to/socket[?db=N].");
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
							   "Redis to keep buckets in: redis://, rediss:// (TLS), redis-sentinel://, rediss-sentinel:// or unix://.",
							   "Only superusers can read or set it: it may hold a password.",
							   &url_setting, "", PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE,
							   check_redis_url, assign_redis_url, NULL);
}

/*
 * Sends the next calls to target (regions.c): 0, ratelimit.redis_url; else
 * url, a region's, whose list changed changes times. What each target's
 * connections and cluster map hold is kept apart (connection.c, cluster.c).
 */
void
redis_url_use_target(int target, const char *url, uint32 changes)
{
	url_target = target;
	target_url = url;
	target_changes = changes;
}

/* The target in use (0: ratelimit.redis_url). */
int
redis_url_target(void)
{
	return url_target;
}

/* The URL now ("" when unset). */
const char *
redis_url_current(void)
{
	if (url_target > 0)
		return target_url;
	return url_setting ? url_setting : "";
}

/* This server's own URL, ratelimit.redis_url, whatever the target in use. */
const char *
redis_url_own(void)
{
	return url_setting ? url_setting : "";
}

/*
 * True when the URL now was set for the whole server, not by a session, role
 * or database (a region's always is).
 */
bool
redis_url_is_server_wide(void)
{
	return url_target > 0 || url_server_wide;
}

/* A number that changes whenever the URL does, another for each target. */
uint32
redis_url_generation(void)
{
	return ((url_target > 0 ? target_changes : url_changes) << 4) | (uint32) url_target;
}
