/*
 * decision_log.c
 *	  The decision log: a server log line per decision that ratelimit.log_decisions
 *	  chooses (none, denied or all), sampled by ratelimit.log_sample_rate.
 *
 * A line names the policy, version, cost, decision, source and a keyed one-way
 * hash of the subject (rl_subject_hash gives the same hash, to find a subject's
 * lines); never the subject, and never the statement, which may hold it.
 */
#include "ratelimit.h"

#include "common/pg_prng.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "decision_log.h"
#include "log_privacy.h"
#include "subject.h"

/* Logs decision if the settings choose it. */
void
decision_log(const Decision *decision, int64 cost, const char *subject, int length)
{
	StringInfoData hash;
	/* A shadow decision that would have denied is what 'denied' is there to show. */
	bool		denied = !decision->allowed || decision->source == DECISION_SOURCE_SHADOW;

	if (rl_log_decisions == LOG_DECISIONS_NONE ||
		(rl_log_decisions == LOG_DECISIONS_DENIED && !denied))
		return;
	if (rl_log_sample_rate < 1.0 && pg_prng_double(&pg_global_prng_state) >= rl_log_sample_rate)
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

/* rl_subject_hash(subject): the hash the decision log writes for subject. */
RL_SQL_FUNCTION(rl_subject_hash)
{
	text	   *subject = PG_GETARG_TEXT_PP(0);
	StringInfoData hash;

	subject_check(VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject));
	initStringInfo(&hash);
	subject_hash(&hash, VARDATA_ANY(subject), VARSIZE_ANY_EXHDR(subject));
	PG_RETURN_TEXT_P(cstring_to_text(hash.data));
}
