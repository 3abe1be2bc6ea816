/*
 * fuzz_cluster.c
 *	  Fuzz target: cluster.c's readers of what Redis sends, cluster_learn_map
 *	  (CLUSTER SLOTS replies) and cluster_redirect (MOVED and ASK errors), in
 *	  any order, keep the node table and slot map consistent: every slot owned
 *	  by a node that exists, every node with a name of its own and an address
 *	  in range.
 *
 * The input is a byte choosing the URL (one node, three seeds, Sentinel,
 * unix), then records: a byte (its low two bits: a slot map, a redirect, a
 * node lost; the rest: the node that answered), two bytes of length (little
 * endian) and that many bytes. A slot map's bytes are scanned as a reply
 * first; each goes to the reader in an exact-size heap copy.
 */
#include "prelude.h"

#include "redis/cluster.h"
#include "redis/url.h"

#include "shim.h"

static const char *const urls[] = {
	"redis://127.0.0.1:7000",
	"redis://10.0.0.1:7000,redis-2.example:7001,[::1]:7002",
	"redis-sentinel://127.0.0.1:26379/mymaster",
	"unix:///run/redis/redis.sock",
};

/*
 * Checks what the rest of the extension relies on: nodes, names, addresses,
 * and with count_slots the slots of the last node (16384 looks: once).
 */
static void
check_nodes(bool count_slots)
{
	int			count = cluster_node_count();
	static const char *const keys[] = {"{tenant_7f2}:reports.export", "a", "{}", "{a}{b}", ""};

	FUZZ_CHECK(count >= 1 && count <= REDIS_MAX_NODES);
	for (int node = 0; node < count; node++)
	{
		const char *name = cluster_node_name(node);
		const char *host;
		int			port;

		FUZZ_CHECK(strlen(name) < REDIS_NODE_NAME);
		if (cluster_node_address(node, &host, &port))
		{
			FUZZ_CHECK(host[0] != '\0' && strlen(host) < 256);
			FUZZ_CHECK(port >= 1 && port <= 65535);
			FUZZ_CHECK(name[0] != '\0');
			/* Names are unique: a node's breaker and rl_health line are its own. */
			FUZZ_CHECK(cluster_node_index(name) == node);
		}
		else
			FUZZ_CHECK(node == 0 && name[0] == '\0');
		FUZZ_CHECK(cluster_seed_after(node) == -1 || cluster_seed_after(node) == node + 1);
	}
	if (count_slots)
	{
		int			slots = cluster_node_slots(count - 1);

		FUZZ_CHECK(slots >= 0 && slots <= CLUSTER_SLOTS);
	}
	for (int i = 0; i < (int) lengthof(keys); i++)
	{
		int			node = cluster_route(keys[i]);

		FUZZ_CHECK(node >= 0 && node < count);
	}
	(void) cluster_wants_map();
}

/* Hands a slot map to cluster_learn_map when the bytes are one whole reply. */
static void
learn_map(const uint8_t *data, size_t length, int from_node)
{
	char	   *copy = shim_copy(data, length);
	RespScanner scanner;
	size_t		reply_length;
	char	   *reply;
	RespValue	value;

	resp_scanner_start(&scanner);
	if (resp_scan(&scanner, copy, length, &reply_length) != RESP_COMPLETE)
	{
		/* As pipeline.c does with a reply it could not read. */
		cluster_map_unreadable();
		pfree(copy);
		return;
	}
	pfree(copy);
	reply = shim_copy(data, reply_length);
	resp_read(reply, &value);
	cluster_learn_map(&value, from_node);
	pfree(reply);
}

/* Reads a redirect; one that is taken names a node that exists. */
static void
redirect(const uint8_t *data, size_t length, int from_node)
{
	char	   *text = shim_copy(data, length);
	bool		ask = false;
	int			node = -1;

	if (cluster_redirect(text, (int) length, from_node, &ask, &node))
	{
		FUZZ_CHECK(node >= 0 && node < cluster_node_count());
		FUZZ_CHECK(ask || cluster_enabled());
	}
	pfree(text);
}

int			LLVMFuzzerTestOneInput(const uint8_t *input, size_t size);

/* One input: a URL, then slot maps and redirects in the order given. */
int
LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
	static bool defined = false;
	size_t		at = 1;

	if (size < 1)
		return 0;
	if (!defined)
	{
		redis_url_init();
		defined = true;
	}
	shim_begin();
	PG_TRY();
	{
		/* Each input starts from nothing: another URL starts the nodes again. */
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", ""));
		cluster_prepare();
		FUZZ_CHECK(shim_set_string_setting("ratelimit.redis_url", urls[input[0] % lengthof(urls)]));
		cluster_prepare();
		check_nodes(false);

		while (at + 3 <= size)
		{
			int			kind = input[at] & 3;
			int			from_node = (input[at] >> 2) % cluster_node_count();
			size_t		length = Min((size_t) (input[at + 1] | input[at + 2] << 8), size - at - 3);
			const uint8_t *data = input + at + 3;

			at += 3 + length;
			if (kind == 0)
				learn_map(data, length, from_node);
			else if (kind == 1)
				redirect(data, length, from_node);
			else
				cluster_map_doubt();
			check_nodes(false);
		}
		check_nodes(true);
	}
	PG_CATCH();
	{
		/* An ERROR with an errcode ends the input, as it would end a statement. */
		shim_error_caught();
	}
	PG_END_TRY();
	shim_end();
	return 0;
}
