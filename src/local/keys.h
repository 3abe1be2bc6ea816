/*
 * keys.h
 *	  How a subject is known in this server's shared-memory tables: a hash
 *	  that places it, and a keyed hash that every match verifies.
 */
#ifndef RL_LOCAL_KEYS_H
#define RL_LOCAL_KEYS_H

#include "base/siphash.h"

typedef struct LocalKey
{
	uint64		hash;			/* where its slot is looked for; never 0 (an empty slot) */
	uint64		check;			/* SipHash of the same identity under the server's secret key */
} LocalKey;

extern void local_keys_init(bool preloaded);
extern Size local_keys_shmem_size(void);
extern void local_keys_shmem_init(void);
extern LocalKey local_keys_of(const char *name, int32 version, uint64 installation,
							  const char *subject, int length);

#endif							/* RL_LOCAL_KEYS_H */
