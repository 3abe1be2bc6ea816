/*
 * headers.c
 *	  A decision as HTTP: the RateLimit headers a client reads (rl_headers, and
 *	  the PostgREST error of enforce.c).
 *
 * The default fields follow draft-ietf-httpapi-ratelimit-headers revision 10:
 *
 *	  RateLimit-Policy: "<policy>";q=<capacity>;w=<seconds to refill an empty bucket>
 *	  RateLimit: "<policy>";r=<remaining>;t=<seconds until the bucket is full>
 *
 * and Retry-After (RFC 9110, delay-seconds) when denied. Legacy mode gives the
 * older RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset instead. Which
 * fields a decision gets depends on who made it (its source): a field is left
 * out rather than filled with a number that no bucket said. Every value is a
 * string, and no field ever names the subject or a Redis key.
 */
#include "prelude.h"

#include "executor/executor.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "base/log_privacy.h"
#include "functions/headers.h"
#include "policy/cache.h"

/* Adds a field to set. */
static void
header_add(HeaderSet *set, const char *name, char *value)
{
	Assert(set->count < HEADERS_MAX);
	set->fields[set->count].name = name;
	set->fields[set->count].value = value;
	set->count++;
}

/*
 * Appends name as a structured-field string (RFC 8941, section 3.3.3). Table
 * policy names need no escaping, but a hand-built rl_decision can hold any
 * text, and a header value must never carry a line break.
 */
static void
append_sf_string(StringInfo buf, const char *name)
{
	appendStringInfoChar(buf, '"');
	for (const unsigned char *p = (const unsigned char *) name; *p != '\0'; p++)
	{
		if (*p < 0x20 || *p > 0x7e)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("the policy name of the decision cannot be written in an HTTP header"),
					 errdetail("A structured-field string holds only printable ASCII characters."),
					 errhint("Name the policy with printable ASCII characters, or build the headers yourself.")));
		if (*p == '"' || *p == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *p);
	}
	appendStringInfoChar(buf, '"');
}

/*
 * Adds the policy's field: its quota, and the window in which a client may
 * spend the quota again, in whole seconds rounded up: for a token bucket or
 * GCRA the time an empty bucket takes to refill completely, for a fixed
 * window the window now counting (a calendar month: this month), for a
 * sliding window two windows, for a sliding log one. limits is NULL when the limits
 * the decision was made under are no longer known: then no window is given.
 */
static void
add_policy_field(HeaderSet *set, const Decision *decision, const Policy *limits, bool legacy)
{
	StringInfoData value;
	int64		quota = Max(decision->capacity, 0);

	if (legacy)
	{
		header_add(set, "RateLimit-Limit", psprintf(INT64_FORMAT, quota));
		return;
	}
	initStringInfo(&value);
	append_sf_string(&value, decision->policy);
	appendStringInfo(&value, ";q=" INT64_FORMAT, quota);
	if (limits != NULL && limits->algorithm == ALGORITHM_CONCURRENCY)
		/* Leases held at once: no window, and the draft's unit for it. */
		appendStringInfoString(&value, ";qu=\"concurrent-requests\"");
	else if (limits != NULL)
		appendStringInfo(&value, ";w=" INT64_FORMAT,
						 decision_seconds_up(limit_ops(&limits->bucket)->full_ms(&limits->bucket)));
	header_add(set, "RateLimit-Policy", value.data);
}

/* Adds the service limit: tokens left (never negative) and seconds until more are there. */
static void
add_service_limit(HeaderSet *set, const Decision *decision, int64 remaining,
				  int64 seconds, bool legacy)
{
	StringInfoData value;

	remaining = Max(remaining, 0);
	if (legacy)
	{
		header_add(set, "RateLimit-Remaining", psprintf(INT64_FORMAT, remaining));
		header_add(set, "RateLimit-Reset", psprintf(INT64_FORMAT, seconds));
		return;
	}
	initStringInfo(&value);
	append_sf_string(&value, decision->policy);
	appendStringInfo(&value, ";r=" INT64_FORMAT ";t=" INT64_FORMAT, remaining, seconds);
	header_add(set, "RateLimit", value.data);
}

/*
 * Fills set with the fields that tell a client about decision. function_oid is
 * the calling SQL function (rl_policy lives in its schema).
 *
 * A shadow policy's limit is only watched, so its decisions show none. A bucket
 * (redis, local) tells what is left; fail_open, disabled and an 'allow'
 * override asked no bucket, so they tell only the policy; fail_closed tells
 * the policy and when to retry; a 'deny' override has nothing left until it
 * expires.
 */
void
headers_build(Oid function_oid, const Decision *decision, bool legacy, HeaderSet *set)
{
	Policy		limits;
	bool		known = policy_limits(function_oid, decision->policy, decision->version, &limits);

	set->count = 0;
	if (decision->source == DECISION_SOURCE_SHADOW ||
		(known && limits.mode == POLICY_MODE_SHADOW))
		return;

	add_policy_field(set, decision, known ? &limits : NULL, legacy);
	if (decision->source == DECISION_SOURCE_REDIS || decision->source == DECISION_SOURCE_LOCAL ||
		decision->source == DECISION_SOURCE_DENY_CACHE ||
		decision->source == DECISION_SOURCE_ALLOWANCE || decision->source == DECISION_SOURCE_REPLAY)
		add_service_limit(set, decision, decision->remaining,
						  decision_seconds_up(decision->reset_after_ms), legacy);
	else if (decision->source == DECISION_SOURCE_OVERRIDE && !decision->allowed)
		add_service_limit(set, decision, 0, decision_retry_after_seconds(decision), legacy);
	if (!decision->allowed)
		header_add(set, "Retry-After", psprintf(INT64_FORMAT, decision_retry_after_seconds(decision)));
}

/* set as a jsonb object of header name to string value. */
static Jsonb *
headers_to_jsonb(const HeaderSet *set)
{
	JsonbParseState *state = NULL;
	JsonbValue *object;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < set->count; i++)
	{
		JsonbValue	key = {.type = jbvString};
		JsonbValue	value = {.type = jbvString};

		key.val.string.val = (char *) set->fields[i].name;
		key.val.string.len = strlen(set->fields[i].name);
		value.val.string.val = set->fields[i].value;
		value.val.string.len = strlen(set->fields[i].value);
		pushJsonbValue(&state, WJB_KEY, &key);
		pushJsonbValue(&state, WJB_VALUE, &value);
	}
	object = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(object);
}

/* Appends set to buf as a JSON object of header name to string value. */
void
headers_append_json(StringInfo buf, const HeaderSet *set)
{
	appendStringInfoChar(buf, '{');
	for (int i = 0; i < set->count; i++)
	{
		if (i > 0)
			appendStringInfoChar(buf, ',');
		escape_json(buf, set->fields[i].name);
		appendStringInfoChar(buf, ':');
		escape_json(buf, set->fields[i].value);
	}
	appendStringInfoChar(buf, '}');
}

/* The value of attribute name of row; NULL is refused like a NULL argument. */
static Datum
row_attribute(HeapTupleHeader row, const char *name)
{
	bool		isnull;
	Datum		value = GetAttributeByName(row, name, &isnull);

	if (isnull)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("decision.%s must not be null", name),
				 errhint("Pass a decision as rl_consume returned it.")));
	return value;
}

/* The source named by text; an unknown one is refused rather than guessed. */
static DecisionSource
source_from_name(const char *name)
{
	for (DecisionSource source = DECISION_SOURCE_REDIS; source < DECISION_SOURCES; source++)
		if (strcmp(decision_source_name(source), name) == 0)
			return source;
	ereport(ERROR,
			(errhidestmt(true),
			 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("decision.source \"%s\" is not a source of decisions", name),
			 errhint("A decision's source is redis, local, fail_open, fail_closed, shadow, disabled, override, deny_cache, allowance or replay.")));
	pg_unreachable();
}

/* Reads an rl_decision row into decision. */
static void
decision_from_row(HeapTupleHeader row, Decision *decision)
{
	char	   *policy = TextDatumGetCString(row_attribute(row, "policy"));

	memset(decision, 0, sizeof(*decision));
	decision->allowed = DatumGetBool(row_attribute(row, "allowed"));
	decision->remaining = DatumGetInt64(row_attribute(row, "remaining"));
	decision->capacity = DatumGetInt64(row_attribute(row, "capacity"));
	decision->retry_after_ms = DatumGetInt64(row_attribute(row, "retry_after_ms"));
	decision->reset_after_ms = DatumGetInt64(row_attribute(row, "reset_after_ms"));
	decision->version = DatumGetInt32(row_attribute(row, "version"));
	decision->source = source_from_name(TextDatumGetCString(row_attribute(row, "source")));
	/* No policy is this long (policy_limits finds none), but the name is still shown. */
	if (strlen(policy) >= sizeof(decision->policy))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("decision.policy is longer than a policy name can be"),
				 errdetail("A policy name has at most %d bytes.", NAMEDATALEN - 1),
				 errhint("Pass a decision as rl_consume returned it.")));
	strlcpy(decision->policy, policy, sizeof(decision->policy));
}

/* rl_headers(decision rl_decision, legacy boolean DEFAULT false) RETURNS jsonb */
RL_SQL_FUNCTION(rl_headers)
{
	Decision	decision;
	HeaderSet	set;

	/* A NULL here is a caller's bug: no headers would read as "no limit". */
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("decision must not be null"),
				 errhint("Pass a decision as rl_consume returned it.")));
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("legacy must not be null"),
				 errhint("Pass false for the RateLimit and RateLimit-Policy fields, true for the older X-RateLimit-* trio, or omit it.")));
	decision_from_row(PG_GETARG_HEAPTUPLEHEADER(0), &decision);
	headers_build(fcinfo->flinfo->fn_oid, &decision, PG_GETARG_BOOL(1), &set);
	PG_RETURN_JSONB_P(headers_to_jsonb(&set));
}
