/*
 * keys.c
 *	  How a subject is known in this server's shared-memory tables (the local
 *	  buckets, the deny cache, the slices): a hash that places it, and a
 *	  keyed hash of the same identity that every match verifies.
 *
 * The placing hash (local_keys_of) is fast and public: lookup3, seeded
 * with the database, policy, version and installation, all of which appear
 * in Redis keys. A role could craft a subject whose hash is another
 * subject's, and share its local bucket, be denied by its remembered denial
 * or take from its slice. So every slot also holds a SipHash of the same
 * identity under a key drawn at server start and kept in shared memory,
 * never shown; a slot is a subject's only when both agree.
 */
#include "prelude.h"

#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "local/keys.h"

typedef struct KeysShared
{
	uint64		secret[2];
} KeysShared;

static KeysShared *shared = NULL;
/* Tests only: the placing hash cut to this many bits, so that subjects collide (0: whole). */
static int	test_key_bits = 0;

/* Defines ratelimit.test_local_key_bits; only when preloaded, since only then are there tables. */
void
local_keys_init(bool preloaded)
{
	if (!preloaded)
		return;
	DefineCustomIntVariable("ratelimit.test_local_key_bits",
							"For tests only: cuts the hash that places subjects in shared memory to this many bits (0: none).",
							"Subjects then share slots often; the keyed check keeps them apart.",
							&test_key_bits, 0, 0, 63,
							PGC_SUSET, GUC_NO_SHOW_ALL | GUC_NOT_IN_SAMPLE, NULL, NULL, NULL);
}

Size
local_keys_shmem_size(void)
{
	return MAXALIGN(sizeof(KeysShared));
}

/* Draws the secret key (in the postmaster), or attaches to it; with AddinShmemInitLock held. */
void
local_keys_shmem_init(void)
{
	bool		found;

	shared = ShmemInitStruct("ratelimit local keys", sizeof(KeysShared), &found);
	if (!found && !pg_strong_random(shared->secret, sizeof(shared->secret)))
		elog(FATAL, "ratelimit: could not generate a random key for its shared memory");
}

/* Starts the keyed check of an identity: the caller hashes its parts, then siphash_final. */
static void
check_start(SipHash *hash)
{
	static const uint64 none[2] = {0, 0};

	/* Without shared memory there is no table to verify against. */
	siphash_init(hash, shared != NULL ? shared->secret : none);
}

/* The placing hash as the tables use it: never 0 (cut short for tests). */
static uint64
place(uint64 hash)
{
	if (test_key_bits > 0)
		hash &= (UINT64CONST(1) << test_key_bits) - 1;
	return hash != 0 ? hash : 1;
}

/*
 * The key of a subject of a policy (its name, version and installation) in
 * this database: all of it hashed to place it, and hashed again under the
 * server's secret key to verify it.
 */
LocalKey
local_keys_of(const char *name, int32 version, uint64 installation, const char *subject,
			  int length)
{
	uint64		seed = hash_bytes_extended((const unsigned char *) name, strlen(name),
										   (((uint64) MyDatabaseId << 32) | (uint32) version) ^
										   installation);
	LocalKey	key;
	SipHash		check;

	key.hash = place(hash_bytes_extended((const unsigned char *) subject, length, seed));
	check_start(&check);
	siphash_update(&check, &MyDatabaseId, sizeof(MyDatabaseId));
	siphash_update(&check, &version, sizeof(version));
	siphash_update(&check, &installation, sizeof(installation));
	/* The name with its NUL: no name and subject run into another pair. */
	siphash_update(&check, name, strlen(name) + 1);
	siphash_update(&check, subject, length);
	key.check = siphash_final(&check);
	return key;
}
