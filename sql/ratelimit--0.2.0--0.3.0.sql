-- ratelimit 0.2.0 -> 0.3.0: statistics, the decision log's subject hash, HTTP headers, PostgREST.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.3.0'" to load this file. \quit

-- Per-policy counters kept in shared memory since the last reset (needs preload). Never a subject.
CREATE FUNCTION @extschema@.rl_stats_read(
    OUT policy text,
    OUT decisions bigint,
    OUT allowed bigint,
    OUT denied bigint,
    OUT tokens_granted bigint,
    OUT shadow_denials bigint,
    OUT source_redis bigint,
    OUT source_local bigint,
    OUT source_fail_open bigint,
    OUT source_fail_closed bigint,
    OUT source_override bigint,
    OUT source_disabled bigint,
    OUT redis_calls bigint,
    OUT redis_errors jsonb,
    OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision,
    OUT latency_max_ms double precision,
    OUT latency_histogram jsonb,
    OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_stats_read' LANGUAGE C VOLATILE PARALLEL RESTRICTED;

CREATE VIEW @extschema@.rl_stats AS SELECT * FROM @extschema@.rl_stats_read();
COMMENT ON VIEW @extschema@.rl_stats IS
    'per-policy decision counters and Redis latency of this server since the last reset; never a subject';

CREATE FUNCTION @extschema@.rl_stats_reset() RETURNS void
AS 'MODULE_PATHNAME', 'rl_stats_reset' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
COMMENT ON FUNCTION @extschema@.rl_stats_reset() IS 'set every rl_stats counter of this database (and the shared "(other)" row) to zero';

-- The one-way hash the decision log writes for a subject, to find a subject's lines.
CREATE FUNCTION @extschema@.rl_subject_hash(subject text) RETURNS text
AS 'MODULE_PATHNAME', 'rl_subject_hash' LANGUAGE C STABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.rl_subject_hash(text) IS
    'the keyed hash that stands for a subject in the decision log';

-- HTTP response headers for a decision: RateLimit-Policy and RateLimit (IETF draft
-- revision 10), Retry-After when denied; legacy => true gives RateLimit-Limit,
-- RateLimit-Remaining and RateLimit-Reset instead of the two structured fields.
-- PARALLEL UNSAFE: it may load the policy cache, which needs the latest snapshot.
CREATE FUNCTION @extschema@.rl_headers(decision @extschema@.rl_decision, legacy boolean DEFAULT false)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'rl_headers' LANGUAGE C STABLE PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.rl_headers(@extschema@.rl_decision, boolean) IS
    'the HTTP response headers (name => string value) that tell a client about a decision';

-- For PostgREST: adds the decision's headers to response.headers (kept for this transaction)
-- and returns the decision.
CREATE FUNCTION @extschema@.rl_response_headers(decision @extschema@.rl_decision, legacy boolean DEFAULT false)
RETURNS @extschema@.rl_decision
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current jsonb := coalesce(nullif(current_setting('response.headers', true), ''), '[]')::jsonb;
BEGIN
    PERFORM set_config('response.headers',
                       (current || coalesce((SELECT jsonb_agg(jsonb_build_object(key, value))
                                             FROM jsonb_each(@extschema@.rl_headers(decision, legacy))),
                                            '[]'))::text,
                       true);
    RETURN decision;
END
$$;
COMMENT ON FUNCTION @extschema@.rl_response_headers(@extschema@.rl_decision, boolean) IS
    'PostgREST: add the decision''s headers to response.headers, return the decision';

REVOKE ALL ON FUNCTION @extschema@.rl_stats_read() FROM PUBLIC;
REVOKE ALL ON @extschema@.rl_stats FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_stats_reset() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_subject_hash(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_headers(@extschema@.rl_decision, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_response_headers(@extschema@.rl_decision, boolean) FROM PUBLIC;
-- Monitoring reads the counters (they hold no subject).
GRANT SELECT ON @extschema@.rl_stats TO pg_monitor;
GRANT EXECUTE ON FUNCTION @extschema@.rl_stats_read() TO pg_monitor;
