-- ratelimit 0.4.0 -> 0.5.0: TLS and Sentinel need no SQL; rl_health says when the last
-- error was seen and which node a backend uses.
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.5.0'" to load this file. \quit

-- Its output columns change: made again, with its privileges.
DROP FUNCTION @extschema@.rl_health();
CREATE FUNCTION @extschema@.rl_health(
    OUT redis_reachable boolean,
    OUT since timestamptz,
    OUT breaker text,
    OUT retry_in_ms bigint,
    OUT last_error text,
    OUT local_buckets_in_use integer,
    OUT local_buckets integer,
    OUT shared boolean,
    OUT last_error_at timestamptz,
    OUT node text)
AS 'MODULE_PATHNAME', 'rl_health' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@.rl_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rl_health() TO pg_monitor;
