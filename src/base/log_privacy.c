/*
 * log_privacy.c
 *	  What the server log may see of us: never a subject, never a secret.
 *
 * Subjects are arguments, so the statement that called us, and the CONTEXT
 * lines of the functions and EXECUTEs around it, may hold one: every
 * SQL-callable function of ours runs under an error context callback that
 * hides both from the server log, for any line logged meanwhile (the client
 * still gets its context). And PostgreSQL logs a setting's new value when a
 * reload changes it, which for ratelimit.redis_url and ratelimit.subject_secret
 * would be a password or the secret: an emit_log_hook (in the postmaster too,
 * when preloaded) leaves the value out of that line. The same hook leaves out
 * the statement of any line logged while a statement that names one of
 * these settings runs (an ALTER ROLE ... SET refused, a SET with a typo),
 * and the value of PostgreSQL's "invalid value for parameter" line for them.
 */
#include "prelude.h"

#include "tcop/tcopprot.h"
#include "utils/elog.h"

#include "base/log_privacy.h"

/* The settings whose values may be secrets. */
static const char *const secret_settings[] = {
	"ratelimit.redis_url",
	"ratelimit.subject_secret",
};

static emit_log_hook_type previous_emit_log_hook = NULL;

/* Hides the statement and the context of the line being logged (an error context callback). */
static void
hide_statement_and_context(void *arg)
{
	errhidestmt(true);
	errhidecontext(true);
}

/* Runs body (an SQL-callable function) so that no line it logs shows the statement or context. */
Datum
log_privacy_call(FunctionCallInfo fcinfo, PGFunction body)
{
	ErrorContextCallback privacy = {
		.callback = hide_statement_and_context,
		.previous = error_context_stack,
	};
	Datum		result;

	error_context_stack = &privacy;
	result = body(fcinfo);
	error_context_stack = privacy.previous;
	return result;
}

/* Leaves the new value out of PostgreSQL's line for a reload that changed a secret setting. */
static void
redact_setting_change(ErrorData *edata)
{
	if (edata->message_id == NULL || edata->message == NULL ||
		strcmp(edata->message_id, "parameter \"%s\" changed to \"%s\"") != 0)
		return;
	for (size_t i = 0; i < lengthof(secret_settings); i++)
	{
		char	   *quoted = psprintf("\"%s\"", secret_settings[i]);
		bool		found = strstr(edata->message, quoted) != NULL;

		pfree(quoted);
		if (found)
		{
			edata->message = psprintf("parameter \"%s\" changed (its value is not logged: it may hold a secret)",
									  secret_settings[i]);
			return;
		}
	}
}

/* True when text names a secret setting (names of settings ignore case). */
static bool
names_secret_setting(const char *text)
{
	for (const char *at = text; *at != '\0'; at++)
		for (size_t i = 0; i < lengthof(secret_settings); i++)
			if (pg_strncasecmp(at, secret_settings[i], strlen(secret_settings[i])) == 0)
				return true;
	return false;
}

/*
 * A line logged while a statement that names a secret setting runs: its
 * statement may hold the value, and so may PostgreSQL's message about a
 * value it refused.
 */
static void
hide_secret_statement(ErrorData *edata)
{
	if (debug_query_string == NULL || !names_secret_setting(debug_query_string))
		return;
	edata->hide_stmt = true;
	if (edata->message_id != NULL && edata->message != NULL &&
		strcmp(edata->message_id, "invalid value for parameter \"%s\": \"%s\"") == 0 &&
		names_secret_setting(edata->message))
		edata->message = pstrdup("invalid value for a ratelimit setting that may hold a secret (its value is not logged)");
}

static void
log_privacy_emit(ErrorData *edata)
{
	redact_setting_change(edata);
	hide_secret_statement(edata);
	if (previous_emit_log_hook)
		previous_emit_log_hook(edata);
}

/* Installs the log hook; called once per process from _PG_init. */
void
log_privacy_init(void)
{
	previous_emit_log_hook = emit_log_hook;
	emit_log_hook = log_privacy_emit;
}
