/*
 * cluster.h
 *	  Where a key lives: the nodes this backend knows of, and for a Redis
 *	  Cluster, which of them owns each slot.
 */
#ifndef RL_CLUSTER_H
#define RL_CLUSTER_H

#include "redis/resp.h"

/* The hash slots of a Redis Cluster, and the most nodes one backend keeps track of. */
#define CLUSTER_SLOTS 16384
#define REDIS_MAX_NODES 64
/* Room for "host:port", the name of a node (a host name is at most 255 bytes). */
#define REDIS_NODE_NAME 272

extern void cluster_prepare(void);
extern uint32 cluster_epoch(void);
extern bool cluster_enabled(void);
extern int	cluster_key_slot(const char *key, int length);
extern int	cluster_route(const char *key);
extern int	cluster_seed_after(int node);
extern bool cluster_wants_map(void);
extern void cluster_map_doubt(void);
extern void cluster_map_asked(void);
extern void cluster_map_unreadable(void);
extern void cluster_learn_map(const RespValue *reply, int from_node);
extern bool cluster_is_redirect(const char *text, int length);
extern bool cluster_redirect(const char *text, int length, int from_node, bool *ask, int *node);
extern bool cluster_node_address(int node, const char **host, int *port);
extern const char *cluster_node_name(int node);
extern int	cluster_node_index(const char *name);
extern int	cluster_node_count(void);
extern int	cluster_node_slots(int node);

#endif							/* RL_CLUSTER_H */
