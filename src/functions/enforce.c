/*
 * enforce.c
 *	  A denial as an error: RL429 for a quota denial, RL503 when Redis could
 *	  not answer and the policy fails closed; with ratelimit.postgrest_errors,
 *	  the PGRST error PostgREST answers with, headers included.
 *
 * The message names the policy, the detail gives the retry-after in whole
 * seconds (what an HTTP Retry-After takes). Never the subject or a key.
 */
#include "prelude.h"

#include "utils/guc.h"
#include "utils/json.h"

#include "functions/enforce.h"
#include "functions/headers.h"

/* SQLSTATE PGRST: PostgREST reads the response it asks for from the message and detail. */
#define ERRCODE_RL_POSTGREST MAKE_SQLSTATE('P', 'G', 'R', 'S', 'T')

static bool postgrest_errors = false;

/* How a denial is worded (palloc'd texts). */
typedef struct Denial
{
	bool		unavailable;	/* RL503: Redis could not answer, the policy fails closed */
	char	   *message;
	char	   *detail;
	char	   *hint;
} Denial;

/* Defines ratelimit.postgrest_errors. */
void
enforce_init(void)
{
	DefineCustomBoolVariable("ratelimit.postgrest_errors",
							 "rl_enforce raises the error PostgREST turns into an HTTP 429 or 503 with headers.",
							 "SQLSTATE PGRST, with the JSON message and detail PostgREST reads.",
							 &postgrest_errors, false, PGC_USERSET, 0, NULL, NULL, NULL);
}

static void
denial_of(const Decision *decision, Denial *denial)
{
	int64		seconds = decision_retry_after_seconds(decision);

	denial->unavailable = decision->source == DECISION_SOURCE_FAIL_CLOSED;
	denial->message = psprintf(denial->unavailable ? "rate limiter unavailable for policy \"%s\"" :
							   "rate limit exceeded for policy \"%s\"", decision->policy);
	denial->detail = psprintf(seconds == 1 ? "Retry after " INT64_FORMAT " second." :
							  "Retry after " INT64_FORMAT " seconds.", seconds);
	denial->hint = denial->unavailable ? pstrdup("Redis did not answer and the policy fails closed.") :
		psprintf("Wait before retrying; the limit is " INT64_FORMAT ".", decision->capacity);
}

/* Appends ,"key":"value" (value escaped) to a JSON object being written. */
static void
append_json_member(StringInfo buf, const char *key, const char *value)
{
	appendStringInfoChar(buf, ',');
	escape_json(buf, key);
	appendStringInfoChar(buf, ':');
	escape_json(buf, value);
}

/*
 * Raises the error PostgREST (v11 and later) answers with an HTTP response of
 * our choosing: SQLSTATE PGRST, the message a JSON object
 * {"code","message","details","hint"} that becomes the response body, and the
 * detail a JSON object {"status","status_text","headers"} whose headers (a map
 * of string to string) are sent as they are. See "Add HTTP Headers with RAISE",
 * https://docs.postgrest.org/en/latest/references/errors.html#raise-headers
 * (PgRaiseErrMessage and PgRaiseErrDetails in PostgREST's RaisePgrst.hs); if
 * either does not parse, PostgREST answers 500 with PGRST121.
 */
static void
raise_postgrest(Oid function_oid, const Decision *decision, const Denial *denial)
{
	HeaderSet	set;
	StringInfoData message;
	StringInfoData detail;

	headers_build(function_oid, decision, false, &set);

	initStringInfo(&message);
	appendStringInfoString(&message, "{\"code\":");
	escape_json(&message, denial->unavailable ? "RL503" : "RL429");
	append_json_member(&message, "message", denial->message);
	append_json_member(&message, "details", denial->detail);
	append_json_member(&message, "hint", denial->hint);
	appendStringInfoChar(&message, '}');

	initStringInfo(&detail);
	appendStringInfo(&detail, "{\"status\":%d", denial->unavailable ? 503 : 429);
	append_json_member(&detail, "status_text",
					   denial->unavailable ? "Service Unavailable" : "Too Many Requests");
	appendStringInfoString(&detail, ",\"headers\":");
	headers_append_json(&detail, &set);
	appendStringInfoChar(&detail, '}');

	/* _internal: JSON for a program to read, never to be translated. */
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(ERRCODE_RL_POSTGREST),
			 errmsg_internal("%s", message.data),
			 errdetail_internal("%s", detail.data)));
}

/*
 * Raises the error for a denial; nothing for a grant. function_oid is the
 * calling SQL function (rl_policy lives in its schema).
 */
void
enforce(Oid function_oid, const Decision *decision)
{
	Denial		denial;

	if (decision->allowed)
		return;
	denial_of(decision, &denial);
	if (postgrest_errors)
		raise_postgrest(function_oid, decision, &denial);
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(denial.unavailable ? ERRCODE_RL_UNAVAILABLE : ERRCODE_RL_RATE_LIMIT_EXCEEDED),
			 errmsg_internal("%s", denial.message),
			 errdetail_internal("%s", denial.detail),
			 errhint("%s", denial.hint)));
}
