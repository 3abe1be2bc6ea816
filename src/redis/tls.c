/*
 * tls.c
 *	  TLS over the socket (rediss://, rediss-sentinel://), with OpenSSL.
 *
 * By default the server's certificate chain is verified against
 * ratelimit.tls_ca_file (empty: the system's trust store) and its name against
 * the host of the URL (or ratelimit.tls_server_name); ratelimit.tls_verify
 * lowers that for tests ('ca': the chain only, 'none': nothing). A client
 * certificate comes from ratelimit.tls_cert_file and ratelimit.tls_key_file,
 * the key read as a private file (secret.c). All of these are for superusers
 * alone.
 *
 * The socket stays non-blocking: the handshake, and every read and write,
 * wait in socket_wait (interrupts served, one deadline), so a cancel works
 * during a handshake that never completes. OpenSSL may want the socket
 * readable to write or writable to read: tls_wants() says so for the next
 * wait, and tls_pending() that decrypted bytes wait in OpenSSL, which the
 * socket will not signal. A connection cut mid-record is an error, never a
 * short read.
 */
#include "prelude.h"

#include <arpa/inet.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "base/secret.h"
#include "redis/socket.h"
#include "redis/tls.h"
#include "redis/url.h"

/* The most bytes of a client key file. */
#define TLS_KEY_MAX_BYTES (64 * 1024)

typedef enum TlsVerify
{
	TLS_VERIFY_FULL,			/* the chain, and the name */
	TLS_VERIFY_CA,				/* the chain only */
	TLS_VERIFY_NONE				/* nothing: for tests only */
} TlsVerify;

static const struct config_enum_entry tls_verify_options[] = {
	{"full", TLS_VERIFY_FULL, false},
	{"ca", TLS_VERIFY_CA, false},
	{"none", TLS_VERIFY_NONE, false},
	{NULL, 0, false}
};

static char *tls_ca_file = NULL;
static char *tls_cert_file = NULL;
static char *tls_key_file = NULL;
static char *tls_server_name = NULL;
static int	tls_verify = TLS_VERIFY_FULL;

static SSL_CTX *context = NULL;
static bool context_stale = true;	/* a setting changed since context was made */
static uint32 settings_changes = 0;

/* Any TLS setting changed: the next connection makes a new context. */
static void
assign_tls_setting(const char *newval, void *extra)
{
	context_stale = true;
	settings_changes++;
}

static void
assign_tls_verify(int newval, void *extra)
{
	context_stale = true;
	settings_changes++;
}

/* A number that changes whenever a TLS setting does: a connection made before is not used. */
uint32
tls_settings_generation(void)
{
	return settings_changes;
}

/* The TLS settings, by name, in the order tls_settings_text gives them. */
static const char *const setting_names[] = {
	"ratelimit.tls_ca_file", "ratelimit.tls_cert_file", "ratelimit.tls_key_file",
	"ratelimit.tls_server_name", "ratelimit.tls_verify"
};

/*
 * The TLS settings in force, as one text: a shared connection is the
 * backend's URL with the backend's TLS settings (tls_settings_use).
 */
const char *
tls_settings_text(void)
{
	static char *text = NULL;
	static uint32 made_for = PG_UINT32_MAX;

	if (text == NULL || made_for != settings_changes)
	{
		StringInfoData out;

		initStringInfo(&out);
		for (int i = 0; i < (int) lengthof(setting_names); i++)
			appendStringInfo(&out, "%s\n", GetConfigOption(setting_names[i], false, false));
		if (text != NULL)
			pfree(text);
		text = MemoryContextStrdup(TopMemoryContext, out.data);
		pfree(out.data);
		made_for = settings_changes;
	}
	return text;
}

/* A shared connection's worker takes a backend's TLS settings (tls_settings_text's). */
void
tls_settings_use(const char *text)
{
	char	   *copy = pstrdup(text);
	char	   *line = copy;

	for (int i = 0; i < (int) lengthof(setting_names) && line != NULL; i++)
	{
		char	   *end = strchr(line, '\n');

		if (end != NULL)
			*end = '\0';
		/* Above the configuration file: a reload leaves the backend's in force. */
		SetConfigOption(setting_names[i], line, PGC_SUSET, PGC_S_OVERRIDE);
		line = end != NULL ? end + 1 : NULL;
	}
	pfree(copy);
}

/* Defines the TLS settings; called once per process from _PG_init. */
void
tls_init(void)
{
	DefineCustomStringVariable("ratelimit.tls_ca_file",
							   "Certificates of the authorities that sign the Redis servers' certificates (PEM); empty means the system's trust store.",
							   NULL, &tls_ca_file, "", PGC_SUSET, GUC_SUPERUSER_ONLY,
							   NULL, assign_tls_setting, NULL);
	DefineCustomStringVariable("ratelimit.tls_cert_file",
							   "Client certificate (PEM, with its chain) for Redis servers that ask for one.",
							   NULL, &tls_cert_file, "", PGC_SUSET, GUC_SUPERUSER_ONLY,
							   NULL, assign_tls_setting, NULL);
	DefineCustomStringVariable("ratelimit.tls_key_file",
							   "Key of the client certificate (PEM); readable by the server's user alone.",
							   NULL, &tls_key_file, "", PGC_SUSET, GUC_SUPERUSER_ONLY,
							   NULL, assign_tls_setting, NULL);
	DefineCustomStringVariable("ratelimit.tls_server_name",
							   "Name the Redis servers' certificates must carry; empty means the host of ratelimit.redis_url.",
							   NULL, &tls_server_name, "", PGC_SUSET, GUC_SUPERUSER_ONLY,
							   NULL, assign_tls_setting, NULL);
	DefineCustomEnumVariable("ratelimit.tls_verify",
							 "What is verified of a Redis server's certificate: full (chain and name), ca (chain only) or none (for tests).",
							 NULL, &tls_verify, TLS_VERIFY_FULL, tls_verify_options,
							 PGC_SUSET, GUC_SUPERUSER_ONLY, NULL, assign_tls_verify, NULL);
}

/* Fills failure with kind and "what: OpenSSL's reason" (or what alone); returns false. */
static bool
tls_fail(RedisFailure *failure, RedisFailureKind kind, const char *what)
{
	unsigned long code = ERR_get_error();
	const char *reason = code != 0 ? ERR_reason_error_string(code) : NULL;
	char		detail[sizeof(failure->detail)];

	if (reason != NULL)
		snprintf(detail, sizeof(detail), "%s: %s", what, reason);
	else
		strlcpy(detail, what, sizeof(detail));
	ERR_clear_error();
	return redis_fail(failure, kind, detail);
}

/* Loads the client key through secret.c's checks, never from a file others may read. */
static bool
load_client_key(SSL_CTX *ctx, RedisFailure *failure)
{
	StringInfoData key;
	const char *problem;
	BIO		   *bio;
	EVP_PKEY   *pkey;

	if (!secret_read_private_file(tls_key_file, "ratelimit.tls_key_file", TLS_KEY_MAX_BYTES,
								  &key, &problem))
		return redis_fail(failure, REDIS_FAILURE_CONFIG, problem);
	bio = BIO_new_mem_buf(key.data, key.len);
	pkey = bio != NULL ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL) : NULL;
	BIO_free(bio);
	explicit_bzero(key.data, key.len);
	pfree(key.data);
	if (pkey == NULL || SSL_CTX_use_PrivateKey(ctx, pkey) != 1)
	{
		EVP_PKEY_free(pkey);
		return tls_fail(failure, REDIS_FAILURE_CONFIG, "cannot use ratelimit.tls_key_file");
	}
	EVP_PKEY_free(pkey);
	if (SSL_CTX_check_private_key(ctx) != 1)
		return tls_fail(failure, REDIS_FAILURE_CONFIG, "the key does not match ratelimit.tls_cert_file");
	return true;
}

/* The context of this backend's TLS connections, made again after a setting changed. */
static SSL_CTX *
tls_context(RedisFailure *failure)
{
	SSL_CTX    *ctx;

	if (context != NULL && !context_stale)
		return context;
	if (context != NULL)
		SSL_CTX_free(context);
	context = NULL;
	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_client_method());
	if (ctx == NULL)
	{
		tls_fail(failure, REDIS_FAILURE_CONFIG, "cannot make a TLS context");
		return NULL;
	}
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	/* A write resumed after WANT_WRITE may send a part, from a buffer that moved. */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	/* Read what the socket has in one read(), not a record header and then its body. */
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_verify(ctx, tls_verify == TLS_VERIFY_NONE ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
	if (tls_ca_file[0] != '\0' ? SSL_CTX_load_verify_locations(ctx, tls_ca_file, NULL) != 1 :
		SSL_CTX_set_default_verify_paths(ctx) != 1)
	{
		tls_fail(failure, REDIS_FAILURE_CONFIG, "cannot load ratelimit.tls_ca_file");
		SSL_CTX_free(ctx);
		return NULL;
	}
	if (tls_cert_file[0] != '\0')
	{
		bool		loaded;

		if (SSL_CTX_use_certificate_chain_file(ctx, tls_cert_file) != 1)
			loaded = tls_fail(failure, REDIS_FAILURE_CONFIG, "cannot load ratelimit.tls_cert_file");
		else if (tls_key_file[0] == '\0')
			loaded = redis_fail(failure, REDIS_FAILURE_CONFIG,
								"ratelimit.tls_cert_file needs ratelimit.tls_key_file");
		else
			loaded = load_client_key(ctx, failure);
		if (!loaded)
		{
			SSL_CTX_free(ctx);
			return NULL;
		}
	}
	context = ctx;
	context_stale = false;
	return context;
}

/* Why a handshake failed: the certificate's problem when it has one, else OpenSSL's reason. */
static bool
handshake_failed(SSL *session, int result, RedisFailure *failure)
{
	long		verified = SSL_get_verify_result(session);
	char		detail[sizeof(failure->detail)];

	if (verified != X509_V_OK)
	{
		snprintf(detail, sizeof(detail), "certificate verify failed: %s",
				 X509_verify_cert_error_string(verified));
		ERR_clear_error();
		return redis_fail(failure, REDIS_FAILURE_TLS, detail);
	}
	if (SSL_get_error(session, result) == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)
		return redis_fail(failure, REDIS_FAILURE_TLS, "connection closed during the TLS handshake");
	return tls_fail(failure, REDIS_FAILURE_TLS, "TLS handshake failed");
}

/*
 * Starts TLS on the open socket rs as tls, and completes the handshake before
 * deadline. host is the URL's host, which the certificate must name unless
 * ratelimit.tls_server_name names another. False, with a failure that says
 * why (the certificate's problem, OpenSSL's reason, a timeout), when it
 * cannot; the caller closes both.
 */
bool
tls_open(TlsSession *tls, RedisSocket *rs, const char *host, int64 deadline,
		 RedisFailure *failure)
{
	/* ratelimit.tls_server_name names this server's Redis, not a region's. */
	const char *name = tls_server_name[0] != '\0' && redis_url_target() == 0 ? tls_server_name : host;
	unsigned char address[sizeof(struct in6_addr)];
	bool		is_address = inet_pton(AF_INET, name, address) == 1 ||
		inet_pton(AF_INET6, name, address) == 1;
	SSL_CTX    *ctx = tls_context(failure);
	SSL		   *session;

	Assert(tls->session == NULL);
	tls->wanted = 0;
	if (ctx == NULL)
		return false;
	session = tls->session = SSL_new(ctx);
	if (session == NULL || SSL_set_fd(session, rs->sock) != 1)
		return tls_fail(failure, REDIS_FAILURE_TLS, "cannot start TLS");
	/* Server Name Indication takes host names only. */
	if (!is_address)
		(void) SSL_set_tlsext_host_name(session, name);
	if (tls_verify == TLS_VERIFY_FULL &&
		(is_address ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(session), name) != 1 :
		 SSL_set1_host(session, name) != 1))
		return tls_fail(failure, REDIS_FAILURE_CONFIG, "cannot check the server's name");
	for (;;)
	{
		int			result;
		int			error;
		uint32		events;

		ERR_clear_error();
		result = SSL_connect(session);
		if (result == 1)
			return true;
		error = SSL_get_error(session, result);
		if (error == SSL_ERROR_WANT_READ)
			events = WL_SOCKET_READABLE;
		else if (error == SSL_ERROR_WANT_WRITE)
			events = WL_SOCKET_WRITEABLE;
		else
			return handshake_failed(session, result, failure);
		if (socket_wait(rs, events, deadline) == 0)
			return redis_fail(failure, REDIS_FAILURE_TIMEOUT, "TLS handshake timeout");
	}
}

/*
 * Maps the outcome of an SSL_read or SSL_write that moved no byte to what
 * send() and recv() return: -1 with EAGAIN to wait (tls_wants says for
 * what), 0 for a clean close, -1 with ECONNRESET for anything else.
 */
static ssize_t
tls_result(TlsSession *tls, int result)
{
	switch (SSL_get_error(tls->session, result))
	{
		case SSL_ERROR_WANT_READ:
			tls->wanted = WL_SOCKET_READABLE;
			errno = EAGAIN;
			return -1;
		case SSL_ERROR_WANT_WRITE:
			tls->wanted = WL_SOCKET_WRITEABLE;
			errno = EAGAIN;
			return -1;
		case SSL_ERROR_ZERO_RETURN:
			return 0;
		default:
			ERR_clear_error();
			errno = ECONNRESET;
			return -1;
	}
}

/* Like send(): the bytes written, or -1 with errno (EAGAIN: wait, see tls_wants). */
ssize_t
tls_send(TlsSession *tls, const char *data, size_t length)
{
	int			result;

	tls->wanted = 0;
	ERR_clear_error();
	result = SSL_write(tls->session, data, (int) Min(length, (size_t) INT_MAX));
	return result > 0 ? result : tls_result(tls, result);
}

/* Like recv(): the bytes read, 0 at a clean close, or -1 with errno (EAGAIN: wait). */
ssize_t
tls_receive(TlsSession *tls, char *buffer, size_t length)
{
	int			result;

	tls->wanted = 0;
	ERR_clear_error();
	result = SSL_read(tls->session, buffer, (int) Min(length, (size_t) INT_MAX));
	return result > 0 ? result : tls_result(tls, result);
}

/* The socket events OpenSSL needs before the last read or write can go on (0: none beyond it). */
uint32
tls_wants(const TlsSession *tls)
{
	return tls->wanted;
}

/* True when OpenSSL holds bytes not yet read: the socket will not say so. */
bool
tls_pending(const TlsSession *tls)
{
	return tls->session != NULL && SSL_has_pending(tls->session);
}

/*
 * True when the idle TLS connection is still open: what arrives between
 * requests may be the server's session tickets, which OpenSSL takes in
 * quietly; anything else (data, an alert, the end) means it is gone.
 */
bool
tls_idle_and_open(TlsSession *tls, RedisSocket *rs)
{
	char		byte;
	int			result;

	/* Usually nothing arrived: the socket says so without OpenSSL. */
	if (!SSL_has_pending(tls->session) && socket_idle_and_open(rs))
		return true;
	ERR_clear_error();
	result = SSL_peek(tls->session, &byte, 1);
	if (result > 0)
		return false;
	if (SSL_get_error(tls->session, result) == SSL_ERROR_WANT_READ)
		return true;
	ERR_clear_error();
	return false;
}

/* Ends the TLS session, if any (the caller closes the socket). */
void
tls_close(TlsSession *tls)
{
	if (tls->session != NULL)
		SSL_free(tls->session);
	tls->session = NULL;
	tls->wanted = 0;
	ERR_clear_error();
}
