/*
 * subject.h
 *	  Subject checks and Redis key building.
 */
#ifndef RL_SUBJECT_H
#define RL_SUBJECT_H

#include "lib/stringinfo.h"

#include "policy/policy.h"

/* Longest subject, scope or prefix kept as it is in a key; longer ones are hashed. */
#define SUBJECT_SAFE_MAX_BYTES 64

extern void subject_init(void);
extern void subject_check(const char *subject, int length);
extern void subject_build_key(StringInfo key, const Policy *policy,
							  const char *subject, int length);
extern bool subject_is_safe_id(const char *text, int length);
extern void subject_hash(StringInfo out, const char *text, int length);
extern void subject_hash_tag(StringInfo out, const char *subject, int length);

#endif							/* RL_SUBJECT_H */
