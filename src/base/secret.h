/*
 * secret.h
 *	  The secrets (the Redis and sentinel passwords, the subject secret, a TLS
 *	  key): where they may come from, and the files that can hold them.
 */
#ifndef RL_SECRET_H
#define RL_SECRET_H

#include "lib/stringinfo.h"
#include "utils/guc.h"

extern void secret_init(bool preloaded);
extern bool secret_source_allowed(const char *name, GucSource source);
extern void secret_refused(const char *name, GucSource source);
extern void secret_accepted(const char *name);
extern const char *secret_url_problem(void);
extern bool secret_redis_password(const char **password, const char **problem);
extern bool secret_sentinel_password(const char **password, const char **problem);
extern bool secret_read_private_file(const char *path, const char *setting, int max_bytes,
									 StringInfo out, const char **problem);
extern const char *secret_subject_key(void);

#endif							/* RL_SECRET_H */
