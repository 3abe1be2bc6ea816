-- ratelimit 0.7.0 -> 0.8.0: allowances (the columns allowance and allowance_ttl,
-- rl_stats.source_allowance, rl_define's allowance and allowance_ttl).
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.8.0'" to load this file. \quit

-- A hot subject's takes granted from this server's slice of at most allowance of its
-- tokens, each slice used for at most allowance_ttl (NULL: every take asks Redis).
ALTER TABLE @extschema@.rl_policy
    ADD COLUMN allowance bigint,
    ADD COLUMN allowance_ttl interval NOT NULL DEFAULT '1 second',
    ADD CONSTRAINT rl_policy_allowance_check
        CHECK (allowance IS NULL
               OR allowance OPERATOR(pg_catalog.>=) 1 AND allowance OPERATOR(pg_catalog.<=) capacity),
    ADD CONSTRAINT rl_policy_allowance_ttl_check
        CHECK (@extschema@._rl_interval_is_whole_ms(allowance_ttl)
               AND @extschema@._rl_interval_ms(allowance_ttl) OPERATOR(pg_catalog.<=) 3600000),
    ADD CONSTRAINT rl_policy_allowance_algorithm_check
        CHECK (allowance IS NULL
               OR algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window']));

-- rl_define takes an allowance now (and returns the new columns): made again (it had no
-- grants).
DROP FUNCTION @extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text);
-- Defines or changes a policy in words close to the requirement:
--   SELECT rl_define('api.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
--   SELECT rl_define('reports.export', 1000, per => '1 month', algorithm => 'fixed_window',
--                    time_zone => 'Europe/Berlin');
-- amount tokens per `per`: refilled continuously for 'token_bucket' (the default) and
-- 'gcra', with bursts of `burst` (default: amount); at most amount in each window of `per`
-- for 'fixed_window', 'sliding_window' and 'sliding_log' (no burst); an allowance slices a
-- hot subject's tokens to each server. On a change, arguments left NULL keep their value. The table's constraints check it like any INSERT or UPDATE,
-- and the caller needs the same rights on rl_policy.
CREATE FUNCTION @extschema@.rl_define(name text, amount bigint, per interval,
                                      burst bigint DEFAULT NULL, fail_mode text DEFAULT NULL,
                                      idle_ttl interval DEFAULT NULL,
                                      local_share numeric DEFAULT NULL,
                                      algorithm text DEFAULT 'token_bucket',
                                      time_zone text DEFAULT NULL,
                                      allowance bigint DEFAULT NULL,
                                      allowance_ttl interval DEFAULT NULL)
RETURNS @extschema@.rl_policy
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO @extschema@.rl_policy AS p
        (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share,
         time_zone, allowance, allowance_ttl)
    VALUES (rl_define.name, rl_define.algorithm, coalesce(rl_define.burst, rl_define.amount),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                 THEN rl_define.amount END,
            rl_define.per, rl_define.idle_ttl,
            coalesce(rl_define.fail_mode, 'closed'), coalesce(rl_define.local_share, 1),
            coalesce(rl_define.time_zone, 'UTC'), rl_define.allowance,
            coalesce(rl_define.allowance_ttl, '1 second'))
    ON CONFLICT (name) DO UPDATE
    SET algorithm = rl_define.algorithm,
        capacity = coalesce(rl_define.burst, rl_define.amount),
        refill_amount = CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                             THEN rl_define.amount END,
        refill_period = rl_define.per,
        idle_ttl = CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) p.algorithm
                        THEN coalesce(rl_define.idle_ttl, p.idle_ttl) ELSE rl_define.idle_ttl END,
        fail_mode = coalesce(rl_define.fail_mode, p.fail_mode),
        local_share = coalesce(rl_define.local_share, p.local_share),
        time_zone = coalesce(rl_define.time_zone, CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) 'fixed_window'
                                                      THEN p.time_zone ELSE 'UTC' END),
        allowance = CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                         THEN coalesce(rl_define.allowance, p.allowance) ELSE rl_define.allowance END,
        allowance_ttl = coalesce(rl_define.allowance_ttl, p.allowance_ttl)
    RETURNING *;
END;

-- rl_stats counts the decisions granted from allowances: its function and view made
-- again, with their privileges.
DROP VIEW @extschema@.rl_stats;
DROP FUNCTION @extschema@._rl_stats_read();
-- Per-policy counters kept in shared memory since the last reset (needs preload): the
-- function behind the view rl_stats.
CREATE FUNCTION @extschema@._rl_stats_read(
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
    OUT source_deny_cache bigint,
    OUT source_allowance bigint,
    OUT redis_calls bigint,
    OUT redis_errors jsonb,
    OUT latency_p50_ms double precision,
    OUT latency_p99_ms double precision,
    OUT latency_max_ms double precision,
    OUT latency_histogram jsonb,
    OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_stats_read' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@._rl_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@._rl_stats_read() TO pg_monitor;

CREATE VIEW @extschema@.rl_stats AS SELECT * FROM @extschema@._rl_stats_read();
REVOKE ALL ON @extschema@.rl_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.rl_stats TO pg_monitor;
COMMENT ON VIEW @extschema@.rl_stats IS
    'per-policy decision counters and Redis latency of this server since the last reset; never a subject';
