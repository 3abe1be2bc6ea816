/*
 * override.h
 *	  The per-subject overrides of rl_override, as the policy cache keeps them.
 */
#ifndef RL_OVERRIDE_H
#define RL_OVERRIDE_H

#include "policy/policy.h"

/* The overrides of one load of the cache: by (policy, subject), and the 'limit' ones by version. */
typedef struct OverrideTables
{
	HTAB	   *by_subject;
	HTAB	   *by_version;
} OverrideTables;

extern void override_load(OverrideTables *tables, MemoryContext context, Oid relid,
						  Snapshot snapshot);
extern void override_use(const OverrideTables *tables);
extern void override_apply(Policy *policy, const char *subject, int length);
extern bool override_limits(const char *name, int32 version, Policy *out);

#endif							/* RL_OVERRIDE_H */
