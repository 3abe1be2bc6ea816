/*
 * siphash.c
 *	  SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed hash of 64 bits.
 *
 * The tables in shared memory find a subject's slot by a fast hash that
 * anyone can compute (lookup3, seeded with ids that appear in Redis keys),
 * so a role could craft a subject whose hash is another's. Each slot also
 * holds this hash of the subject's identity, under a key made at server
 * start and never shown, and a match must agree on both: without the key,
 * no one can choose a collision of it.
 */
#include "prelude.h"

#include "base/siphash.h"

/* x rotated left by b bits. */
static inline uint64
rotate_left(uint64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

/* One SipRound. */
static inline void
sip_round(SipHash *h)
{
	h->v0 += h->v1;
	h->v1 = rotate_left(h->v1, 13);
	h->v1 ^= h->v0;
	h->v0 = rotate_left(h->v0, 32);
	h->v2 += h->v3;
	h->v3 = rotate_left(h->v3, 16);
	h->v3 ^= h->v2;
	h->v0 += h->v3;
	h->v3 = rotate_left(h->v3, 21);
	h->v3 ^= h->v0;
	h->v2 += h->v1;
	h->v1 = rotate_left(h->v1, 17);
	h->v1 ^= h->v2;
	h->v2 = rotate_left(h->v2, 32);
}

/* Takes in one 8-byte word of the message (two compression rounds). */
static inline void
sip_word(SipHash *h, uint64 m)
{
	h->v3 ^= m;
	sip_round(h);
	sip_round(h);
	h->v0 ^= m;
}

/* Starts a hash under key (two 64-bit words: k0, k1). */
void
siphash_init(SipHash *hash, const uint64 key[2])
{
	hash->v0 = key[0] ^ UINT64CONST(0x736f6d6570736575);
	hash->v1 = key[1] ^ UINT64CONST(0x646f72616e646f6d);
	hash->v2 = key[0] ^ UINT64CONST(0x6c7967656e657261);
	hash->v3 = key[1] ^ UINT64CONST(0x7465646279746573);
	hash->tail = 0;
	hash->ntail = 0;
	hash->length = 0;
}

/* Hashes length more bytes of data (read as little-endian words, whatever the machine). */
void
siphash_update(SipHash *hash, const void *data, size_t length)
{
	const unsigned char *bytes = data;

	hash->length += length;
	for (size_t i = 0; i < length; i++)
	{
		hash->tail |= (uint64) bytes[i] << (8 * hash->ntail);
		if (++hash->ntail == 8)
		{
			sip_word(hash, hash->tail);
			hash->tail = 0;
			hash->ntail = 0;
		}
	}
}

/* The hash of every byte given (four finalization rounds). */
uint64
siphash_final(SipHash *hash)
{
	sip_word(hash, hash->tail | ((hash->length & 0xff) << 56));
	hash->v2 ^= 0xff;
	sip_round(hash);
	sip_round(hash);
	sip_round(hash);
	sip_round(hash);
	return hash->v0 ^ hash->v1 ^ hash->v2 ^ hash->v3;
}
