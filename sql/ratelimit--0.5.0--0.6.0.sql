-- ratelimit 0.5.0 -> 0.6.0: Redis Cluster needs no SQL of its own; rl_health has a row
-- for each node with a breaker (each cluster master), and says how many slots it owns.
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.6.0'" to load this file. \quit

-- It returns a set now: made again, with its privileges.
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
    OUT node text,
    OUT slots integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_health' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@.rl_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rl_health() TO pg_monitor;
