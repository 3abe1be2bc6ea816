/*
 * fakes.c
 *	  The project's own functions below the fuzzed files (base/secret.c,
 *	  redis/tls.c, redis/socket.c), standing in for them outside a server: they
 *	  answer as a server with no secret files and default TLS settings would.
 */
#include "prelude.h"

#include "base/secret.h"
#include "redis/handoff.h"
#include "redis/socket.h"
#include "redis/tls.h"

/* Any source may set a URL with a password (the check is secret.c's, not fuzzed here). */
bool
secret_source_allowed(const char *name, GucSource source)
{
	return true;
}

/* Never called: every source is allowed. */
void
secret_refused(const char *name, GucSource source)
{
}

/* Nothing to note: no secret file is read here. */
void
secret_accepted(const char *name)
{
}

/* No ratelimit.redis_password_file: only a URL's password is sent. */
bool
secret_redis_password(const char **password, const char **problem)
{
	*password = NULL;
	return true;
}

/* Nothing wrong with how the URL was set. */
const char *
secret_url_problem(void)
{
	return NULL;
}

/* No ratelimit.sentinel_password_file: sentinels are asked without AUTH. */
bool
secret_sentinel_password(const char **password, const char **problem)
{
	*password = NULL;
	return true;
}

/* The TLS settings never change here. */
uint32
tls_settings_generation(void)
{
	return 0;
}

/* No address is kept: names are never resolved here. */
void
socket_forget_address(void)
{
}

/* The TLS settings as a worker would be told them: none. */
const char *
tls_settings_text(void)
{
	return "";
}

/* ratelimit.redis_connections = backend here: nothing is handed off. */
void
handoff_init(void)
{
}

bool
handoff_enabled(void)
{
	return false;
}

HandoffOutcome
handoff_exchange(const HandoffNode *node, StringInfo request, int nreplies, int64 deadline,
				 int64 idle_us, ExchangeReplyHandler handler, void *arg, int *channel,
				 uint64 *generation, RedisFailure *failure)
{
	return HANDOFF_NONE;
}

void
handoff_discard(int channel, uint64 generation)
{
}

void
handoff_node(int channel, char *node, size_t size)
{
	strlcpy(node, "", size);
}
