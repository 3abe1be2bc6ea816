/*
 * failure.c
 *	  Why Redis gave no usable answer: the classes the fail modes, the breaker,
 *	  the log and rl_health speak of.
 */
#include "prelude.h"

#include "redis/failure.h"

/* Records a failure of the given kind with a short detail; returns false, for callers to return. */
bool
redis_fail(RedisFailure *failure, RedisFailureKind kind, const char *detail)
{
	failure->kind = kind;
	strlcpy(failure->detail, detail ? detail : "", sizeof(failure->detail));
	return false;
}

/* True when text[0 .. length) contains needle. */
static bool
contains(const char *text, int length, const char *needle)
{
	int			n = strlen(needle);

	for (int i = 0; i + n <= length; i++)
		if (memcmp(text + i, needle, n) == 0)
			return true;
	return false;
}

/*
 * The command Redis names in a permission error ("... run the 'set' command"),
 * upper-cased into detail, or what was refused when it names none.
 */
static void
permission_detail(const char *text, int length, char *detail, size_t size)
{
	const char *quote = memchr(text, '\'', length);
	const char *close = quote ? memchr(quote + 1, '\'', length - (quote + 1 - text)) : NULL;
	int			n;

	if (quote != NULL && close != NULL && close - quote - 1 < (int) size && close > quote + 1)
	{
		n = close - quote - 1;
		for (int i = 0; i < n; i++)
			detail[i] = pg_toupper((unsigned char) quote[1 + i]);
		detail[n] = '\0';
	}
	else if (contains(text, length, "key"))
		strlcpy(detail, "a key outside the user's key patterns", size);
	else
		strlcpy(detail, "a command the script runs", size);
}

/* Error replies that say the node cannot serve, or not now, by their first word. */
static const struct
{
	const char *code;
	RedisFailureKind kind;
}			error_kinds[] = {
	{"READONLY", REDIS_FAILURE_READONLY},
	/* A master that refuses writes without its replicas (min-replicas-to-write). */
	{"NOREPLICAS", REDIS_FAILURE_READONLY},
	{"LOADING", REDIS_FAILURE_LOADING},
	{"MASTERDOWN", REDIS_FAILURE_MASTERDOWN},
	{"CLUSTERDOWN", REDIS_FAILURE_CLUSTERDOWN},
	{"TRYAGAIN", REDIS_FAILURE_TRYAGAIN},
	{"BUSY", REDIS_FAILURE_BUSY},
	{"OOM", REDIS_FAILURE_OOM},
	{"NOSCRIPT", REDIS_FAILURE_NOSCRIPT},
	{"NOAUTH", REDIS_FAILURE_AUTH},
	{"WRONGPASS", REDIS_FAILURE_AUTH},
};

/*
 * True for the error of a script that failed on its own (a Lua error, a
 * script given the wrong number of arguments), filling detail with its
 * message: "user_script:12: too many results to unpack". An error reply of a
 * command the script ran (WRONGTYPE, OOM) keeps its own first word and is
 * not one. Our scripts check the state they read and say so ("bucket state
 * is corrupt"), so what is left is what the request's values made the
 * script do.
 */
static bool
script_error(const char *text, int length, char *detail, size_t size)
{
	static const char *const starts[] = {
		"ERR user_script:",		/* Redis 7 */
		"ERR Error running script",	/* Redis 6 */
		"ERR ratelimit script called with", /* ours: the wrong number of arguments */
	};
	int			start = -1;
	int			end;

	for (int i = 0; i < (int) lengthof(starts) && start < 0; i++)
		if (length >= (int) strlen(starts[i]) && memcmp(text, starts[i], strlen(starts[i])) == 0)
			start = 4;
	if (start < 0)
		return false;
	/* Up to Redis's " script: <sha>" suffix, which names no key either. */
	for (end = start; end < length && end - start < (int) size - 1; end++)
		if (end + 8 <= length && memcmp(text + end, " script:", 8) == 0)
			break;
	memcpy(detail, text + start, end - start);
	detail[end - start] = '\0';
	return true;
}

/*
 * Fills failure from the text of an error reply: a permission refusal says
 * which command (NOPERM, or a script's "can't run this command"), a script
 * that failed its message, any other error its first word ("WRONGTYPE",
 * "OOM", ...).
 */
void
redis_fail_with_error(RedisFailure *failure, const char *text, int length)
{
	int			word = 0;

	if (script_error(text, length, failure->detail, sizeof(failure->detail)))
	{
		failure->kind = REDIS_FAILURE_SCRIPT;
		return;
	}

	while (word < length && text[word] != ' ')
		word++;
	if ((word == 6 && strncmp(text, "NOPERM", 6) == 0) ||
		contains(text, length, "can't run this command") ||
		contains(text, length, "can't access"))
	{
		int			command = 0;

		/* Our scripts answer "NOPERM <COMMAND> ..." for a command their ACL refused. */
		while (word == 6 && 7 + command < length && command < 31 &&
			   text[7 + command] >= 'A' && text[7 + command] <= 'Z')
			command++;
		failure->kind = REDIS_FAILURE_PERMISSION;
		if (command > 0 && (7 + command == length || text[7 + command] == ' '))
		{
			memcpy(failure->detail, text + 7, command);
			failure->detail[command] = '\0';
		}
		else
			permission_detail(text, length, failure->detail, sizeof(failure->detail));
		return;
	}
	failure->kind = REDIS_FAILURE_REPLY;
	for (int i = 0; i < (int) lengthof(error_kinds); i++)
		if (word == (int) strlen(error_kinds[i].code) &&
			strncmp(text, error_kinds[i].code, word) == 0)
			failure->kind = error_kinds[i].kind;
	word = Min(word, (int) sizeof(failure->detail) - 1);
	memcpy(failure->detail, text, word);
	failure->detail[word] = '\0';
}

/* The failure kind as logs and docs name it. */
const char *
redis_failure_kind_name(RedisFailureKind kind)
{
	switch (kind)
	{
		case REDIS_FAILURE_NONE:
			return "none";
		case REDIS_FAILURE_CONFIG:
			return "configuration";
		case REDIS_FAILURE_CONNECT:
			return "connect";
		case REDIS_FAILURE_TIMEOUT:
			return "timeout";
		case REDIS_FAILURE_IO:
			return "connection lost";
		case REDIS_FAILURE_PROTOCOL:
			return "protocol";
		case REDIS_FAILURE_REPLY:
			return "error reply";
		case REDIS_FAILURE_PERMISSION:
			return "permission";
		case REDIS_FAILURE_TLS:
			return "tls";
		case REDIS_FAILURE_SENTINEL:
			return "sentinel";
		case REDIS_FAILURE_READONLY:
			return "readonly";
		case REDIS_FAILURE_LOADING:
			return "loading";
		case REDIS_FAILURE_MASTERDOWN:
			return "masterdown";
		case REDIS_FAILURE_BUSY:
			return "busy";
		case REDIS_FAILURE_OOM:
			return "oom";
		case REDIS_FAILURE_NOSCRIPT:
			return "noscript";
		case REDIS_FAILURE_CLUSTERDOWN:
			return "clusterdown";
		case REDIS_FAILURE_TRYAGAIN:
			return "tryagain";
		case REDIS_FAILURE_REDIRECT:
			return "redirect";
		case REDIS_FAILURE_AUTH:
			return "authentication";
		case REDIS_FAILURE_SCRIPT:
			return "script";
	}
	return "unknown";
}

/*
 * True for a failure that says this node cannot serve anyone now (a replica,
 * loading, without its master, a cluster that is down): the connection to it
 * is closed, so that the next one (for a Sentinel URL, to the master found
 * again) is another.
 */
bool
redis_failure_wrong_node(RedisFailureKind kind)
{
	return kind == REDIS_FAILURE_READONLY || kind == REDIS_FAILURE_LOADING ||
		kind == REDIS_FAILURE_MASTERDOWN || kind == REDIS_FAILURE_CLUSTERDOWN;
}
