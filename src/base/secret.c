/*
 * secret.c
 *	  The secrets (the Redis and sentinel passwords, the subject secret, a TLS
 *	  key): where they may come from, and the files that can hold them.
 *
 * A secret must be readable by superusers (and pg_read_all_settings) alone,
 * in every set-up. Settings marked superuser-only are that, with one gap each
 * way: a value stored in pg_db_role_setting or pg_proc (ALTER ROLE, ALTER
 * DATABASE, a function's SET clause) is readable by every role in the catalog,
 * and a value in postgresql.conf is a plain placeholder, readable by every
 * role, in each session until that session loads the library, unless the
 * library is in shared_preload_libraries. So a value that carries a secret (a
 * URL with a password, a non-empty subject secret) is refused from those
 * sources; the check hooks say why, and decisions report the refusal.
 *
 * The way that works in every set-up, with or without preloading, is a file
 * readable only by the server's operating-system user:
 * ratelimit.redis_password_file, ratelimit.sentinel_password_file,
 * ratelimit.subject_secret_file and ratelimit.tls_key_file name one, and
 * nothing secret then passes through a setting, a catalog or a log line.
 */
#include "prelude.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "storage/fd.h"
#include "utils/guc.h"

#include "base/secret.h"

/* The longest secret a file may hold. */
#define SECRET_MAX_BYTES 1024

static char *subject_secret = NULL;
static char *subject_secret_file = NULL;
static char *redis_password_file = NULL;
static char *sentinel_password_file = NULL;
static bool library_preloaded = false;

/* Why the last value of a setting was refused from a non-interactive source; "" if it was not. */
static char url_refusal[64];
static char subject_secret_refusal[256];

/* A secret read from a file, and what the file was when it was read. */
typedef struct SecretFile
{
	char		value[SECRET_MAX_BYTES + 1];
	char		path[MAXPGPATH];
	struct stat seen;
	bool		loaded;
} SecretFile;

static SecretFile redis_password;
static SecretFile sentinel_password;
static SecretFile subject_key;

/* The setting that names a file for the secret that setting name carries. */
static const char *
file_setting_for(const char *name)
{
	return strcmp(name, "ratelimit.subject_secret") == 0 ?
		"ratelimit.subject_secret_file" : "ratelimit.redis_password_file";
}

/*
 * For a check hook whose new value carries a secret: true when source keeps it
 * from roles without the right to read settings; else sets the check hook's
 * message and returns false.
 */
bool
secret_source_allowed(const char *name, GucSource source)
{
	const char *why = NULL;

	switch (source)
	{
		case PGC_S_TEST:
		case PGC_S_GLOBAL:
		case PGC_S_DATABASE:
		case PGC_S_USER:
		case PGC_S_DATABASE_USER:
			why = "Settings of roles, databases and functions are kept in catalogs that every role can read.";
			break;
		case PGC_S_DEFAULT:
		case PGC_S_DYNAMIC_DEFAULT:
		case PGC_S_OVERRIDE:
			break;
		default:
			/*
			 * Without preload a value can reach a setting while the library is
			 * not loaded, unchecked: in postgresql.conf it is a placeholder
			 * every role reads, and a function's SET clause made then lands
			 * in pg_proc. So only files hold secrets then.
			 */
			if (!library_preloaded)
				why = "ratelimit is not in shared_preload_libraries: a value set while a session has not loaded the library is a placeholder that every role can read, or a catalog entry nothing checked.";
			break;
	}
	if (why == NULL)
		return true;
	/* Never the value: it is the secret. */
	GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
	GUC_check_errmsg("%s must not hold a secret where other roles can read it", name);
	GUC_check_errdetail("%s", why);
	GUC_check_errhint("Put the secret in a file that only the server's operating-system user can read, and name that file in %s.",
					  file_setting_for(name));
	return false;
}

/*
 * Remembers that a value of name carrying a secret was refused from source,
 * so that decisions can say why they have no Redis or no secret. A refusal
 * from an interactive source raised an error to its caller instead.
 */
void
secret_refused(const char *name, GucSource source)
{
	if (source == PGC_S_TEST || source >= PGC_S_INTERACTIVE)
		return;
	if (strcmp(name, "ratelimit.subject_secret") == 0)
		snprintf(subject_secret_refusal, sizeof(subject_secret_refusal),
				 "The value set for it (from %s) was refused: other roles could read it there.",
				 source <= PGC_S_ARGV ? "the configuration" : "a role or database setting");
	else
		strlcpy(url_refusal, "ratelimit.redis_url refused: a password others can read",
				sizeof(url_refusal));
}

/* A value of name was accepted: an earlier refusal no longer matters. */
void
secret_accepted(const char *name)
{
	if (strcmp(name, "ratelimit.subject_secret") == 0)
		subject_secret_refusal[0] = '\0';
	else
		url_refusal[0] = '\0';
}

/* Why ratelimit.redis_url has no value, when one was refused (a short class); else NULL. */
const char *
secret_url_problem(void)
{
	return url_refusal[0] != '\0' ? url_refusal : NULL;
}

/*
 * Reads the secret in the file at path into file, unless it was read already
 * and the file has not changed (one open and fstat per use). NULL, or a short problem (never the secret),
 * naming the setting: the file must be a regular file of the server's user,
 * readable by nobody else, and not empty.
 */
static const char *
secret_file_read(SecretFile *file, const char *path, const char *setting)
{
	static char problem[64];
	struct stat seen;
	int			fd;
	ssize_t		length;

	/*
	 * Opened first and checked by its descriptor, so that what is checked is
	 * what is read: no symbolic link, no FIFO that would block.
	 */
	fd = OpenTransientFile(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | PG_BINARY);
	if (fd < 0 || fstat(fd, &seen) != 0)
	{
		if (fd >= 0)
			CloseTransientFile(fd);
		snprintf(problem, sizeof(problem), "cannot read %s", setting);
		return problem;
	}
	if (file->loaded && strcmp(file->path, path) == 0 && seen.st_ino == file->seen.st_ino &&
		seen.st_dev == file->seen.st_dev && seen.st_mtime == file->seen.st_mtime &&
		seen.st_size == file->seen.st_size && seen.st_mode == file->seen.st_mode)
	{
		CloseTransientFile(fd);
		return NULL;
	}
	file->loaded = false;
	explicit_bzero(file->value, sizeof(file->value));
	if (!S_ISREG(seen.st_mode) || seen.st_uid != geteuid() ||
		(seen.st_mode & (S_IRWXG | S_IRWXO)) != 0)
	{
		CloseTransientFile(fd);
		snprintf(problem, sizeof(problem), "%s: others may read it", setting);
		return problem;
	}
	length = read(fd, file->value, SECRET_MAX_BYTES + 1);
	CloseTransientFile(fd);
	if (length < 0 || length > SECRET_MAX_BYTES)
	{
		explicit_bzero(file->value, sizeof(file->value));
		snprintf(problem, sizeof(problem), length < 0 ? "cannot read %s" : "%s: file too long",
				 setting);
		return problem;
	}
	/* One line: the newline an editor adds is not part of the secret. */
	while (length > 0 && (file->value[length - 1] == '\n' || file->value[length - 1] == '\r'))
		length--;
	file->value[length] = '\0';
	if (length == 0 || strlen(file->value) != (size_t) length)
	{
		snprintf(problem, sizeof(problem), "%s: %s", setting,
				 length == 0 ? "file is empty" : "file holds a NUL byte");
		return problem;
	}
	strlcpy(file->path, path, sizeof(file->path));
	file->seen = seen;
	file->loaded = true;
	return NULL;
}

/*
 * The password in the file a setting names (path), or NULL when the setting
 * is empty. False, with a short problem, when the file cannot be used.
 */
static bool
password_from_file(SecretFile *file, const char *path, const char *setting,
				   const char **password, const char **problem)
{
	*password = NULL;
	if (path == NULL || path[0] == '\0')
		return true;
	*problem = secret_file_read(file, path, setting);
	if (*problem != NULL)
		return false;
	*password = file->value;
	return true;
}

/* The Redis password in ratelimit.redis_password_file (for a URL that names none). */
bool
secret_redis_password(const char **password, const char **problem)
{
	return password_from_file(&redis_password, redis_password_file,
							  "ratelimit.redis_password_file", password, problem);
}

/* The sentinels' password in ratelimit.sentinel_password_file. */
bool
secret_sentinel_password(const char **password, const char **problem)
{
	return password_from_file(&sentinel_password, sentinel_password_file,
							  "ratelimit.sentinel_password_file", password, problem);
}

/*
 * Reads the whole private file at path (a TLS key) into out, palloc'd, at most
 * max_bytes. As PostgreSQL asks of its own key file: a regular file, of the
 * server's user and readable by it alone, or of root and readable by root's
 * group at most. False, with a short problem naming setting, when it is not.
 */
bool
secret_read_private_file(const char *path, const char *setting, int max_bytes,
						 StringInfo out, const char **problem)
{
	static char reason[96];
	struct stat seen;
	int			fd;
	ssize_t		length;

	*problem = reason;
	fd = OpenTransientFile(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | PG_BINARY);
	if (fd < 0 || fstat(fd, &seen) != 0)
	{
		if (fd >= 0)
			CloseTransientFile(fd);
		snprintf(reason, sizeof(reason), "cannot read %s", setting);
		return false;
	}
	if (!S_ISREG(seen.st_mode) ||
		!((seen.st_uid == geteuid() && (seen.st_mode & (S_IRWXG | S_IRWXO)) == 0) ||
		  (seen.st_uid == 0 && (seen.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO)) == 0)))
	{
		CloseTransientFile(fd);
		snprintf(reason, sizeof(reason), "%s: others may read it", setting);
		return false;
	}
	initStringInfo(out);
	enlargeStringInfo(out, max_bytes + 1);
	length = read(fd, out->data, max_bytes + 1);
	CloseTransientFile(fd);
	if (length <= 0 || length > max_bytes)
	{
		explicit_bzero(out->data, out->maxlen);
		snprintf(reason, sizeof(reason), length < 0 ? "cannot read %s" :
				 length == 0 ? "%s: file is empty" : "%s: file too long", setting);
		return false;
	}
	out->len = length;
	out->data[length] = '\0';
	*problem = NULL;
	return true;
}

/*
 * The key of the subject hash: ratelimit.subject_secret_file's secret, else
 * ratelimit.subject_secret (empty: unkeyed). Raises 55000 when the secret
 * that was set cannot be used: hashing without it would put subjects in other
 * buckets and make them easier to guess.
 */
const char *
secret_subject_key(void)
{
	const char *problem;

	if (subject_secret_file == NULL || subject_secret_file[0] == '\0')
	{
		if (subject_secret[0] == '\0' && subject_secret_refusal[0] != '\0')
			ereport(ERROR,
					(errhidestmt(true),
					 errhidecontext(true),
					 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("ratelimit.subject_secret was refused"),
					 errdetail("%s", subject_secret_refusal),
					 errhint("Put the secret in a file that only the server's operating-system user can read, and name that file in ratelimit.subject_secret_file.")));
		return subject_secret;
	}
	if (subject_secret[0] != '\0')
		ereport(ERROR,
				(errhidestmt(true),
				 errhidecontext(true),
				 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("both ratelimit.subject_secret and ratelimit.subject_secret_file are set"),
				 errhint("Keep the secret in the file and leave ratelimit.subject_secret empty.")));
	problem = secret_file_read(&subject_key, subject_secret_file, "ratelimit.subject_secret_file");
	if (problem != NULL)
		ereport(ERROR,
				(errhidestmt(true),
				 errhidecontext(true),
				 errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the subject secret cannot be read: %s", problem),
				 errhint("The file must belong to the server's operating-system user, be readable by it alone (chmod 600), and hold the secret on one line.")));
	return subject_key.value;
}

/* A subject secret is accepted only from sources that keep it private. */
static bool
check_subject_secret(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (secret_source_allowed("ratelimit.subject_secret", source))
		return true;
	secret_refused("ratelimit.subject_secret", source);
	return false;
}

static void
assign_subject_secret(const char *newval, void *extra)
{
	secret_accepted("ratelimit.subject_secret");
}

/*
 * Defines the settings of the secrets; preloaded says whether the library is
 * in shared_preload_libraries. Called first from _PG_init: the check hook of
 * ratelimit.redis_url asks where secrets may come from.
 */
void
secret_init(bool preloaded)
{
	library_preloaded = preloaded;
	DefineCustomStringVariable("ratelimit.subject_secret",
							   "Secret key of the hash that stands for subjects that are not safe ids.",
							   "Only superusers can read or set it. Changing it starts new buckets.",
							   &subject_secret, "", PGC_SUSET,
							   GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE,
							   check_subject_secret, assign_subject_secret, NULL);
	DefineCustomStringVariable("ratelimit.subject_secret_file",
							   "File holding the subject secret; readable by the server's user alone.",
							   "Used instead of ratelimit.subject_secret, which must then be empty.",
							   &subject_secret_file, "", PGC_SIGHUP, GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("ratelimit.redis_password_file",
							   "File holding the Redis password, for a ratelimit.redis_url without one; readable by the server's user alone.",
							   NULL, &redis_password_file, "", PGC_SIGHUP, GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("ratelimit.sentinel_password_file",
							   "File holding the password of the sentinels a redis-sentinel:// URL names; readable by the server's user alone.",
							   "The data nodes' password is the URL's, or ratelimit.redis_password_file's.",
							   &sentinel_password_file, "", PGC_SIGHUP, GUC_NOT_IN_SAMPLE,
							   NULL, NULL, NULL);
}
