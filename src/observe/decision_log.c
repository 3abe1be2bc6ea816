/*
 * decision_log.c
 *	  The decision log: a server log line per decision that ratelimit.log_decisions
 *	  chooses (none, denied or all), sampled by ratelimit.log_sample_rate.
 *
 * A line names the policy, version, cost, decision, source and a keyed one-way
 * hash of the subject (rl_subject_hash gives the same hash, to find a subject's
 * lines); never the subject, and never the statement, which may hold it.
 */
#include "prelude.h"

#include "common/pg_prng.h"
#include "utils/guc.h"

#include "observe/decision_log.h"
#include "policy/subject.h"

typedef enum LogDecisions
{
	LOG_DECISIONS_NONE,
	LOG_DECISIONS_DENIED,
	LOG_DECISIONS_ALL
} LogDecisions;

static const struct config_enum_entry log_decisions_options[] = {
	{"none", LOG_DECISIONS_NONE, false},
	{"denied", LOG_DECISIONS_DENIED, false},
	{"all", LOG_DECISIONS_ALL, false},
	{NULL, 0, false}
};

static int	log_decisions = LOG_DECISIONS_NONE;
static double log_sample_rate = 1.0;

/* Defines ratelimit.log_decisions and ratelimit.log_sample_rate. */
void
decision_log_init(void)
{
	DefineCustomEnumVariable("ratelimit.log_decisions",
							 "Which decisions get a log line: none, denied or all.",
							 "A line holds policy, version, cost, decision, source and a hash of the subject, never the subject.",
							 &log_decisions, LOG_DECISIONS_NONE, log_decisions_options,
							 PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomRealVariable("ratelimit.log_sample_rate",
							 "Share of the decisions chosen by ratelimit.log_decisions that are logged.",
							 NULL, &log_sample_rate, 1.0, 0.0, 1.0,
							 PGC_SUSET, 0, NULL, NULL, NULL);
}

/* Logs decision if the settings choose it. */
void
decision_log(const Decision *decision, int64 cost, const char *subject, int length)
{
	StringInfoData hash;
	/* A shadow decision that would have denied is what 'denied' is there to show. */
	bool		denied = !decision->allowed || decision->source == DECISION_SOURCE_SHADOW;

	if (log_decisions == LOG_DECISIONS_NONE ||
		(log_decisions == LOG_DECISIONS_DENIED && !denied))
		return;
	if (log_sample_rate < 1.0 && pg_prng_double(&pg_global_prng_state) >= log_sample_rate)
		return;

	initStringInfo(&hash);
	subject_hash(&hash, subject, length);
	ereport(LOG,
			(errhidestmt(true),
			 errhidecontext(true),
			 errmsg("ratelimit decision: policy=%s version=%d cost=" INT64_FORMAT
					" decision=%s source=%s remaining=" INT64_FORMAT
					" retry_after_ms=" INT64_FORMAT " subject=%s",
					decision->policy, decision->version, cost,
					decision->allowed ? "allowed" : "denied",
					decision_source_name(decision->source), decision->remaining,
					decision->retry_after_ms, hash.data)));
	pfree(hash.data);
}
