/*
 * tls.h
 *	  TLS over a socket, with OpenSSL, under the same non-blocking waits.
 */
#ifndef RL_TLS_H
#define RL_TLS_H

#include "redis/failure.h"
#include "redis/socket.h"

/* One TLS session over a socket (session is OpenSSL's SSL, NULL: none). */
typedef struct TlsSession
{
	struct ssl_st *session;
	uint32		wanted;			/* socket events OpenSSL waits for before it can go on */
} TlsSession;

extern void tls_init(void);
extern uint32 tls_settings_generation(void);
extern const char *tls_settings_text(void);
extern void tls_settings_use(const char *text);
extern bool tls_open(TlsSession *tls, RedisSocket *rs, const char *host, int64 deadline,
					 RedisFailure *failure);
extern ssize_t tls_send(TlsSession *tls, const char *data, size_t length);
extern ssize_t tls_receive(TlsSession *tls, char *buffer, size_t length);
extern uint32 tls_wants(const TlsSession *tls);
extern bool tls_pending(const TlsSession *tls);
extern bool tls_idle_and_open(TlsSession *tls, RedisSocket *rs);
extern void tls_close(TlsSession *tls);

#endif							/* RL_TLS_H */
