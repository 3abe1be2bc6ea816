/*
 * cluster.c
 *	  Where a key lives: the nodes this backend knows of, and for a Redis
 *	  Cluster, which of them owns each slot.
 *
 * Node 0 is the URL's node: the one it names, the master its sentinels name,
 * or its unix socket. A redis:// or rediss:// URL's nodes (one or several
 * "seeds") are asked once, with the first call, whether they are a cluster
 * (CLUSTER SLOTS, in the same round trip); a cluster's answer is its slot map,
 * and each call then goes to the master that owns its keys' slot. A MOVED
 * reply moves that slot at once and has the whole map read again with the
 * next call; ASK sends one call elsewhere without touching the map.
 *
 * Nothing here does I/O: pipeline.c asks and hands over what came back.
 * Everything is per backend and starts again when ratelimit.redis_url changes.
 */
#include "prelude.h"

#include "utils/memutils.h"

#include "base/clock.h"
#include "redis/cluster.h"
#include "redis/regions.h"
#include "redis/url.h"

typedef struct ClusterNode
{
	char		host[256];		/* "" for node 0 of a Sentinel or unix URL */
	int			port;
	char		name[REDIS_NODE_NAME];	/* "host:port", as logs and rl_health show it */
} ClusterNode;

/* What this backend knows of one target's Redis (redis_url_target()). */
typedef struct ClusterMap
{
	ClusterNode nodes[REDIS_MAX_NODES];
	int			node_count;
	int			seed_count;		/* nodes 0 .. seed_count - 1 are the URL's */
	int16		slot_owner[CLUSTER_SLOTS];	/* a node, or -1: ask a seed */
	bool		mode_known;		/* whether the URL's Redis said if it is a cluster */
	bool		is_cluster;
	bool		map_stale;		/* a MOVED, or a node lost, says the map may be out of date */
	int64		map_read_us;	/* when the map was last read (clock_monotonic_us) */
	uint32		prepared_for;	/* redis_url_generation() the nodes were last checked for */
	char	   *prepared_url;	/* the URL they are for */
	bool		map_refused;	/* the cluster refused CLUSTER SLOTS (an ACL): redirects alone */
	uint32		epoch;			/* changes when the nodes start again */
} ClusterMap;

/* While a node is lost, the map is read again at most this often (a failover takes seconds). */
#define CLUSTER_MAP_RETRY_US (200 * 1000)

static ClusterMap maps[REDIS_MAX_TARGETS];

/* The map of the target in use: every function below reads and writes it. */
#define M (&maps[redis_url_target()])

/*
 * Adds a node by address, or finds it; -1 when the table is full, or for a
 * host that is no C string (a NUL in it would cut its name short, or empty it:
 * no address, the URL's node's breaker).
 */
static int
node_find(const char *host, int host_length, int port)
{
	if (host_length <= 0 || memchr(host, '\0', host_length) != NULL)
		return -1;
	for (int i = 0; i < M->node_count; i++)
		if (M->nodes[i].port == port && (int) strlen(M->nodes[i].host) == host_length &&
			memcmp(M->nodes[i].host, host, host_length) == 0)
			return i;
	if (M->node_count == REDIS_MAX_NODES || host_length >= 256)
		return -1;
	memcpy(M->nodes[M->node_count].host, host, host_length);
	M->nodes[M->node_count].host[host_length] = '\0';
	M->nodes[M->node_count].port = port;
	snprintf(M->nodes[M->node_count].name, sizeof(M->nodes[M->node_count].name),
			 memchr(host, ':', host_length) ? "[%s]:%d" : "%s:%d", M->nodes[M->node_count].host, port);
	return M->node_count++;
}

/* Starts again from the URL's nodes when the URL changed; call before any other. */
void
cluster_prepare(void)
{
	RedisUrl	url;
	const char *problem;

	if (M->prepared_url != NULL && M->prepared_for == redis_url_generation())
		return;
	M->prepared_for = redis_url_generation();
	/* A reload assigns the URL again: only another value starts again. */
	if (M->prepared_url != NULL && strcmp(M->prepared_url, redis_url_current()) == 0)
		return;
	if (M->prepared_url != NULL)
		pfree(M->prepared_url);
	M->prepared_url = MemoryContextStrdup(TopMemoryContext, redis_url_current());
	M->epoch++;
	M->map_refused = false;
	M->map_read_us = 0;
	M->node_count = 0;
	M->mode_known = true;
	M->is_cluster = M->map_stale = false;
	memset(M->slot_owner, 0xff, sizeof(M->slot_owner));
	if (redis_url_parse(redis_url_current(), &url, &problem) && url.nseeds > 0)
	{
		for (int i = 0; i < url.nseeds; i++)
			(void) node_find(url.seeds[i].host, strlen(url.seeds[i].host), url.seeds[i].port);
		/* Only a host and port can be a cluster node: asked with the first call. */
		M->mode_known = false;
	}
	if (M->node_count == 0)
	{
		/* Sentinel, unix, or a URL connecting will refuse: one node, found elsewhere. */
		memset(&M->nodes[0], 0, sizeof(M->nodes[0]));
		/*
		 * Its breaker is named "" (the server's Redis); a region's by its
		 * target, so that one Redis's outage never opens another's breaker.
		 */
		if (redis_url_target() > 0)
			snprintf(M->nodes[0].name, sizeof(M->nodes[0].name), "(region %s)",
					 regions_name_of(redis_url_target()));
		M->node_count = 1;
	}
	M->seed_count = M->node_count;
}

/* A number that changes whenever the nodes start again: connections opened before are not reused. */
uint32
cluster_epoch(void)
{
	return M->epoch;
}

/* True when the URL's Redis is a cluster (as far as it has said). */
bool
cluster_enabled(void)
{
	return M->is_cluster;
}

/* CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with. */
static uint16
crc16(const char *data, int length)
{
	uint16		crc = 0;

	for (int i = 0; i < length; i++)
	{
		crc ^= (uint16) ((unsigned char) data[i]) << 8;
		for (int bit = 0; bit < 8; bit++)
			crc = (crc & 0x8000) ? (uint16) ((crc << 1) ^ 0x1021) : (uint16) (crc << 1);
	}
	return crc;
}

/*
 * The hash slot of a key: of what is between its first "{" and the first "}"
 * after it when that is not empty (a hash tag), else of the whole key.
 */
int
cluster_key_slot(const char *key, int length)
{
	const char *open = memchr(key, '{', length);

	if (open != NULL)
	{
		const char *start = open + 1;
		const char *close = memchr(start, '}', length - (start - key));

		if (close != NULL && close > start)
			return crc16(start, close - start) & (CLUSTER_SLOTS - 1);
	}
	return crc16(key, length) & (CLUSTER_SLOTS - 1);
}

/* The node to send a call on key to: the owner of its slot, else the first seed. */
int
cluster_route(const char *key)
{
	int			owner;

	if (!M->is_cluster)
		return 0;
	owner = M->slot_owner[cluster_key_slot(key, strlen(key))];
	return owner >= 0 ? owner : 0;
}

/* The seed to try when node cannot be reached and the map is not known: -1 when none is left. */
int
cluster_seed_after(int node)
{
	if (M->is_cluster || M->mode_known || node + 1 >= M->seed_count)
		return -1;
	return node + 1;
}

/* True when the next call should ask for the slot map (CLUSTER SLOTS) first. */
bool
cluster_wants_map(void)
{
	return !M->mode_known || (M->is_cluster && M->map_stale && !M->map_refused &&
						   clock_monotonic_us() - M->map_read_us >= CLUSTER_MAP_RETRY_US);
}

/*
 * The slot map is being asked for: until its answer, or CLUSTER_MAP_RETRY_US,
 * it is not asked again (an answer that never comes must not be asked for
 * with every call).
 */
void
cluster_map_asked(void)
{
	M->map_read_us = clock_monotonic_us();
}

/*
 * The map was asked for but its answer could not be read (too large, the
 * connection closed on it: a proxy that knows no CLUSTER): taken as no cluster,
 * unless a redirect says otherwise.
 */
void
cluster_map_unreadable(void)
{
	if (!M->is_cluster)
		M->mode_known = true;
}

/*
 * A node could not be reached, or its breaker is open: its slots may have
 * another master soon (a replica promoted). The map is read again, within
 * CLUSTER_MAP_RETRY_US of the last time, until it names a master that answers.
 */
void
cluster_map_doubt(void)
{
	if (M->is_cluster)
		M->map_stale = true;
}

/* Copies a bulk string's host into node lookup; "" or "?" means the node asked. */
static int
map_node(const RespValue *host, const RespValue *port, int from_node)
{
	if (host->type != RESP_BULK || port->type != RESP_INTEGER ||
		port->integer < 1 || port->integer > 65535)
		return -1;
	/* NULL, "" or "?": an unknown endpoint, the node that answered (by its port). */
	if (host->null || host->length == 0 || (host->length == 1 && host->str[0] == '?'))
		return M->nodes[from_node].host[0] ? node_find(M->nodes[from_node].host,
													strlen(M->nodes[from_node].host),
													(int) port->integer) : -1;
	return node_find(host->str, host->length, (int) port->integer);
}

/*
 * Takes in the reply to CLUSTER SLOTS asked of from_node: an error says it is
 * no cluster (unless it said it is one before: the map stays as it is), an
 * array of [first slot, last slot, [master host, port, ...], replicas...]
 * is the map. A malformed one changes no map: a redirect will tell.
 */
void
cluster_learn_map(const RespValue *reply, int from_node)
{
	RespIterator ranges;
	RespValue	range;
	int16	   *owners;

	if (reply->type != RESP_ARRAY || reply->null)
	{
		/* No cluster; or one whose ACL refuses the map: its redirects will do. */
		if (M->is_cluster)
			M->map_refused = true;
		M->mode_known = true;
		return;
	}
	owners = palloc(sizeof(M->slot_owner));
	memset(owners, 0xff, sizeof(M->slot_owner));
	resp_iterate(reply, &ranges);
	while (resp_next(&ranges, &range))
	{
		RespIterator parts;
		RespValue	first,
					last,
					master,
					host,
					port;
		RespIterator address;
		int			node;

		if (range.type != RESP_ARRAY || range.null)
			goto malformed;
		resp_iterate(&range, &parts);
		if (!resp_next(&parts, &first) || !resp_next(&parts, &last) ||
			!resp_next(&parts, &master) || first.type != RESP_INTEGER ||
			last.type != RESP_INTEGER || first.integer < 0 || last.integer >= CLUSTER_SLOTS ||
			first.integer > last.integer || master.type != RESP_ARRAY || master.null)
			goto malformed;
		resp_iterate(&master, &address);
		if (!resp_next(&address, &host) || !resp_next(&address, &port))
			goto malformed;
		node = map_node(&host, &port, from_node);
		if (node < 0)
			goto malformed;
		for (int64 slot = first.integer; slot <= last.integer; slot++)
			owners[slot] = (int16) node;
	}
	memcpy(M->slot_owner, owners, sizeof(M->slot_owner));
	pfree(owners);
	M->is_cluster = M->mode_known = true;
	M->map_stale = false;
	M->map_read_us = clock_monotonic_us();
	return;

malformed:
	pfree(owners);
	/* Not a cluster's map: taken as no cluster, unless it said otherwise before. */
	if (!M->is_cluster)
		M->mode_known = true;
}

/* True for the text of an error reply that redirects: "MOVED ..." or "ASK ...". */
bool
cluster_is_redirect(const char *text, int length)
{
	return (length > 6 && memcmp(text, "MOVED ", 6) == 0) ||
		(length > 4 && memcmp(text, "ASK ", 4) == 0);
}

/*
 * Reads an error reply from from_node that redirects a call, "MOVED <slot>
 * <host>:<port>" or "ASK <slot> <host>:<port>": true with the node to send it to, after MOVED
 * with the slot moved in the map. False for any other reply, and for a
 * redirect to an address that cannot be used.
 */
bool
cluster_redirect(const char *text, int length, int from_node, bool *ask, int *node)
{
	const char *p;
	const char *end = text + length;
	const char *colon = NULL;
	long		slot = 0;
	long		port = 0;

	/* A Sentinel or unix URL's node is no cluster's: it cannot redirect. */
	if (M->seed_count == 0 || M->nodes[0].host[0] == '\0')
		return false;
	if (length > 6 && memcmp(text, "MOVED ", 6) == 0)
	{
		*ask = false;
		p = text + 6;
	}
	else if (length > 4 && memcmp(text, "ASK ", 4) == 0)
	{
		*ask = true;
		p = text + 4;
	}
	else
		return false;
	if (p == end || *p < '0' || *p > '9')
		return false;
	while (p < end && *p >= '0' && *p <= '9' && slot < CLUSTER_SLOTS)
		slot = slot * 10 + (*p++ - '0');
	if (slot >= CLUSTER_SLOTS || p == end || *p++ != ' ')
		return false;
	/* host:port, the port after the last ":" (an IPv6 host has several). */
	for (const char *c = p; c < end; c++)
		if (*c == ':')
			colon = c;
	if (colon == NULL || colon == end - 1)
		return false;
	for (const char *c = colon + 1; c < end; c++)
	{
		if (*c < '0' || *c > '9' || port > 65535)
			return false;
		port = port * 10 + (*c - '0');
	}
	if (port < 1 || port > 65535)
		return false;
	/* ":port": an unknown endpoint, the host of the node that answered. */
	if (colon == p)
		*node = node_find(M->nodes[from_node].host, strlen(M->nodes[from_node].host), (int) port);
	else
		*node = node_find(p, colon - p, (int) port);
	if (*node < 0)
		return false;
	if (!*ask)
	{
		/* A node that redirects is a cluster's, whatever CLUSTER SLOTS said (an ACL may refuse it). */
		M->is_cluster = M->mode_known = true;
		M->slot_owner[slot] = (int16) *node;
		/* Read at once: a slot moved seldom moves alone. */
		M->map_stale = true;
		M->map_read_us = 0;
	}
	return true;
}

/* The address of a node; false for node 0 of a URL that is no host and port. */
bool
cluster_node_address(int node, const char **host, int *port)
{
	Assert(node >= 0 && node < M->node_count);
	if (M->nodes[node].host[0] == '\0')
		return false;
	*host = M->nodes[node].host;
	*port = M->nodes[node].port;
	return true;
}

/* "host:port" of a node, as logs and rl_health show it ("" for node 0 of a Sentinel or unix URL). */
const char *
cluster_node_name(int node)
{
	Assert(node >= 0 && node < M->node_count);
	return M->nodes[node].name;
}

/* The node of a name ("host:port"), -1 when this backend knows of none. */
int
cluster_node_index(const char *name)
{
	if (name[0] == '\0')
		return -1;
	for (int i = 0; i < M->node_count; i++)
		if (strcmp(M->nodes[i].name, name) == 0)
			return i;
	return -1;
}

/* How many nodes this backend knows of. */
int
cluster_node_count(void)
{
	return M->node_count;
}

/* How many slots a node owns in this backend's map (0 when not a cluster). */
int
cluster_node_slots(int node)
{
	int			count = 0;

	if (!M->is_cluster)
		return 0;
	for (int slot = 0; slot < CLUSTER_SLOTS; slot++)
		count += M->slot_owner[slot] == node;
	return count;
}
