/*
 * siphash.h
 *	  SipHash-2-4: a keyed hash whose collisions cannot be chosen without the key.
 */
#ifndef RL_SIPHASH_H
#define RL_SIPHASH_H

/* A hash under way: update it with bytes, then read it once with siphash_final. */
typedef struct SipHash
{
	uint64		v0,
				v1,
				v2,
				v3;
	uint64		tail;			/* bytes not yet hashed, the first in the low byte */
	int			ntail;
	uint64		length;			/* bytes given in all */
} SipHash;

extern void siphash_init(SipHash *hash, const uint64 key[2]);
extern void siphash_update(SipHash *hash, const void *data, size_t length);
extern uint64 siphash_final(SipHash *hash);

#endif							/* RL_SIPHASH_H */
