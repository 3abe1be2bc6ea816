/*
 * subject.c
 *	  Subject checks and Redis key building.
 *
 * A key is  prefix:scope:v<version>[.<installation>]:{subject}:policy
 * (docs/design.md, principle 2), or the same with {tag}/rest for a subject
 * "tag/rest" whose tag is a safe id, so that related subjects share a Redis
 * Cluster slot. The braces are a Redis Cluster hash tag, so all buckets of one
 * subject share a slot. A subject that is a safe id (letters, digits, "_", "." and "-", at most
 * 64 bytes) appears as it is; anything else (e-mails, tokens, long or odd text)
 * appears only as "#" and a keyed hash, so no raw secret reaches Redis and no
 * text can inject a brace or a separator. "#" is not a safe-id character, so a
 * hashed subject never equals a plain one.
 */
#include "prelude.h"

#include "common/hmac.h"
#include "common/sha2.h"
#include "miscadmin.h"
#include "commands/dbcommands.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/secret.h"
#include "policy/subject.h"

/* Bytes of the HMAC-SHA256 kept in a key: 128 bits, printed as 32 hex digits. */
#define SUBJECT_HASH_BYTES 16

/* The first two segments of every key: settings that only superusers set. */
static char *key_prefix = NULL;
static char *key_scope = NULL;

/* True when text is kept as it is in a key. */
bool
subject_is_safe_id(const char *text, int length)
{
	if (length <= 0 || length > SUBJECT_SAFE_MAX_BYTES)
		return false;
	for (int i = 0; i < length; i++)
	{
		char		c = text[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
			return false;
	}
	return true;
}

/* Raises 22023 for a subject that is empty or too long. */
void
subject_check(const char *subject, int length)
{
	if (length == 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rate limit subject must not be empty"),
				 errhint("Pass the identity being limited: a tenant, a user, an address.")));
	if (length > RL_SUBJECT_MAX_BYTES)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("rate limit subject is too long"),
				 errdetail("A subject has at most %d bytes; this one has %d.",
						   RL_SUBJECT_MAX_BYTES, length),
				 errhint("Pass a shorter identity, or a hash of it (md5, sha256).")));
}

/* Appends 32 hex digits of the HMAC-SHA256 of text keyed by ratelimit.subject_secret. */
void
subject_hash(StringInfo out, const char *text, int length)
{
	pg_hmac_ctx *hmac;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	const char *secret = secret_subject_key();

	hmac = pg_hmac_create(PG_SHA256);
	if (hmac == NULL ||
		pg_hmac_init(hmac, (const uint8 *) secret, strlen(secret)) < 0 ||
		pg_hmac_update(hmac, (const uint8 *) text, length) < 0 ||
		pg_hmac_final(hmac, digest, sizeof(digest)) < 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("could not hash a rate limit subject"),
				 errhint("The server is short of memory: try again.")));
	pg_hmac_free(hmac);

	enlargeStringInfo(out, 2 * SUBJECT_HASH_BYTES);
	out->len += hex_encode((const char *) digest, SUBJECT_HASH_BYTES, out->data + out->len);
	out->data[out->len] = '\0';
}

/* Appends text as it is when it is a safe id, else "#" and its keyed hash in hex. */
static void
append_safe(StringInfo key, const char *text, int length)
{
	if (subject_is_safe_id(text, length))
	{
		appendBinaryStringInfo(key, text, length);
		return;
	}
	appendStringInfoChar(key, '#');
	subject_hash(key, text, length);
}

/*
 * The scope segment of every key: ratelimit.key_scope (a safe id, checked when
 * set), else this database's name, safe or hashed. A hashed name is kept with
 * the secret it was hashed with, so that it is hashed again only when that changes.
 */
static const char *
key_scope_segment(void)
{
	static char *database_name = NULL;
	static char *segment = NULL;
	static char *hashed_with = NULL;	/* NULL: the name is a safe id */
	StringInfoData rendered;
	const char *secret;
	bool		safe;

	if (key_scope != NULL && key_scope[0] != '\0')
		return key_scope;
	if (database_name == NULL)
	{
		char	   *name = get_database_name(MyDatabaseId);

		database_name = MemoryContextStrdup(TopMemoryContext, name ? name : "");
	}
	/* A safe name needs no secret: it is as it is. */
	safe = subject_is_safe_id(database_name, strlen(database_name));
	secret = safe ? NULL : secret_subject_key();
	if (segment != NULL && (safe || strcmp(hashed_with, secret) == 0))
		return segment;
	initStringInfo(&rendered);
	append_safe(&rendered, database_name, strlen(database_name));
	if (segment != NULL)
		pfree(segment);
	if (hashed_with != NULL)
		pfree(hashed_with);
	segment = MemoryContextStrdup(TopMemoryContext, rendered.data);
	hashed_with = safe ? NULL : MemoryContextStrdup(TopMemoryContext, secret);
	pfree(rendered.data);
	return segment;
}

/* Length of the hash tag part of subject: the safe id before a "/", or 0 if none. */
static int
subject_tag_length(const char *subject, int length)
{
	const char *slash = memchr(subject, '/', length);

	if (slash != NULL && subject_is_safe_id(subject, slash - subject))
		return slash - subject;
	return 0;
}

/* Appends the hash tag of subject, whose tag part is tag bytes long (subject_tag_length). */
static void
append_hash_tag(StringInfo out, const char *subject, int length, int tag)
{
	if (tag > 0)
		appendBinaryStringInfo(out, subject, tag);
	else
		append_safe(out, subject, length);
}

/*
 * Appends the hash tag of subject (what goes between the braces): for
 * "tenant/user" with a safe-id "tenant", that part; else the whole subject,
 * safe or hashed. Subjects with one tag share a Redis Cluster slot.
 */
void
subject_hash_tag(StringInfo out, const char *subject, int length)
{
	append_hash_tag(out, subject, length, subject_tag_length(subject, length));
}

/* Appends n in base 36 (digits and lower-case letters). */
static void
append_base36(StringInfo out, uint64 n)
{
	char		digits[16];
	int			length = 0;

	do
	{
		digits[length++] = "0123456789abcdefghijklmnopqrstuvwxyz"[n % 36];
		n /= 36;
	} while (n > 0);
	while (length > 0)
		appendStringInfoChar(out, digits[--length]);
}

/*
 * Builds the Redis key of policy's bucket for subject (already checked). The
 * version segment is v<version>, followed by .<installation> for an
 * installation made by 0.4 or later: versions start again at 1 in an
 * extension dropped and created again, and must not find its old buckets.
 */
void
subject_build_key(StringInfo key, const Policy *policy, const char *subject, int length)
{
	int			tag = subject_tag_length(subject, length);

	appendStringInfo(key, "%s:%s:v%d", key_prefix, key_scope_segment(), policy->version);
	if (policy->installation != 0)
	{
		appendStringInfoChar(key, '.');
		append_base36(key, policy->installation);
	}
	appendStringInfoString(key, ":{");
	append_hash_tag(key, subject, length, tag);
	appendStringInfoChar(key, '}');
	if (tag > 0)
	{
		/* "tenant/user": the part after the "/" follows the tag, safe or hashed. */
		appendStringInfoChar(key, '/');
		append_safe(key, subject + tag + 1, length - tag - 1);
	}
	appendStringInfo(key, ":%s", policy->name);
}

/* Key segments must be safe ids: no separator, no brace, bounded length. */
static bool
check_key_segment(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (!subject_is_safe_id(*newval, strlen(*newval)))
	{
		GUC_check_errdetail("Use 1 to %d letters, digits, \"_\", \".\" or \"-\".",
							SUBJECT_SAFE_MAX_BYTES);
		return false;
	}
	return true;
}

/* The prefix may not be empty: every key starts with it. */
static bool
check_key_prefix(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
	{
		GUC_check_errdetail("The key prefix must not be empty.");
		return false;
	}
	return check_key_segment(newval, extra, source);
}

/*
 * Defines ratelimit.key_prefix and ratelimit.key_scope; called once per
 * process from _PG_init. Superuser-only: a role that could change them would
 * escape its limits.
 */
void
subject_init(void)
{
	DefineCustomStringVariable("ratelimit.key_prefix",
							   "First segment of every Redis key.",
							   NULL, &key_prefix, "rl", PGC_SUSET, 0,
							   check_key_prefix, NULL, NULL);
	DefineCustomStringVariable("ratelimit.key_scope",
							   "Second segment of every Redis key; empty means the database name.",
							   "Servers that should share buckets use the same scope.",
							   &key_scope, "", PGC_SUSET, 0,
							   check_key_segment, NULL, NULL);
}
