-- ratelimit 0.9.0 -> 0.10.0: waiting for budget (max_wait), settling the real cost
-- (rl_settle, max_debt) and idempotent decisions (request_id, replay_window).
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.10.0'" to load this file. \quit

ALTER TABLE @extschema@.rl_policy
    ADD COLUMN max_debt bigint,
    ADD COLUMN replay_window interval NOT NULL DEFAULT '1 hour',
    ADD CONSTRAINT rl_policy_max_debt_check
        CHECK (max_debt IS NULL
               OR max_debt OPERATOR(pg_catalog.>=) 0
                  AND algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                  AND max_debt OPERATOR(pg_catalog.<) (9007199254740992::bigint OPERATOR(pg_catalog.-) capacity)
                  AND (refill_amount IS NULL
                       OR @extschema@._rl_bucket_is_exact(capacity OPERATOR(pg_catalog.+) max_debt,
                                                          refill_amount, refill_period))),
    ADD CONSTRAINT rl_policy_replay_window_check
        CHECK (@extschema@._rl_interval_is_whole_ms(replay_window)
               AND @extschema@._rl_interval_ms(replay_window) OPERATOR(pg_catalog.>=) 1
               AND @extschema@._rl_interval_ms(replay_window) OPERATOR(pg_catalog.<=) 604800000);
COMMENT ON CONSTRAINT rl_policy_max_debt_check ON @extschema@.rl_policy IS
    'max_debt is NULL (the capacity) or a whole number of tokens from 0, only for token_bucket, gcra and fixed_window, with capacity + max_debt exact (as capacity must be).';
COMMENT ON CONSTRAINT rl_policy_replay_window_check ON @extschema@.rl_policy IS
    'replay_window is a whole number of milliseconds from 1 ms to 7 days.';

-- How long a call waited.
ALTER TYPE @extschema@.rl_decision ADD ATTRIBUTE waited_ms bigint;
ALTER TYPE @extschema@.rl_subject_decision ADD ATTRIBUTE waited_ms bigint;

-- The functions that take the new arguments are made again: an added argument with a
-- default would make every call of the old one ambiguous. What a role was granted on the
-- old one is granted on the new one, and a REVOKE from PUBLIC kept (statements kept in a
-- setting of this session until the new ones exist).
CREATE TEMPORARY TABLE rl_upgrade_functions (old_signature text, new_signature text);
INSERT INTO rl_upgrade_functions VALUES
    ('@extschema@.rl_consume(text, text, bigint)', '@extschema@.rl_consume(text, text, bigint, interval, text)'),
    ('@extschema@.rl_enforce(text, text, bigint)', '@extschema@.rl_enforce(text, text, bigint, interval, text)'),
    ('@extschema@.rl_reserve(text, text, bigint)', '@extschema@.rl_reserve(text, text, bigint, interval, text)'),
    ('@extschema@.rl_consume_all(text[], text[], bigint[])', '@extschema@.rl_consume_all(text[], text[], bigint[], text)'),
    ('@extschema@.rl_consume_many(text, text[], bigint[])', '@extschema@.rl_consume_many(text, text[], bigint[], text[])'),
    ('@extschema@.rl_acquire(text, text, text)', '@extschema@.rl_acquire(text, text, text, interval)'),
    ('@extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval)',
     '@extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval, bigint, interval)');
SELECT pg_catalog.set_config('rl_upgrade.grants', coalesce(pg_catalog.string_agg(g.statement, '; '), ''), true)
  FROM (SELECT pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s%s', n.new_signature,
                                 CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END,
                                 CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END) AS statement
          FROM rl_upgrade_functions n
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) n.old_signature::pg_catalog.regprocedure
         CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
          LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
         WHERE a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE' AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
        UNION ALL
        SELECT pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', n.new_signature)
          FROM rl_upgrade_functions n
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) n.old_signature::pg_catalog.regprocedure
         WHERE p.proacl IS NOT NULL
           AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(p.proacl) a
                           WHERE a.grantee OPERATOR(pg_catalog.=) 0
                             AND a.privilege_type OPERATOR(pg_catalog.=) 'EXECUTE')) g;

DROP FUNCTION @extschema@.rl_consume(text, text, bigint);
DROP FUNCTION @extschema@.rl_enforce(text, text, bigint);
DROP FUNCTION @extschema@.rl_reserve(text, text, bigint);
DROP FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[]);
DROP FUNCTION @extschema@.rl_consume_many(text, text[], bigint[]);
DROP FUNCTION @extschema@.rl_acquire(text, text, text);
DROP FUNCTION @extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval);

-- Defines or changes a policy in words close to the requirement:
--   SELECT rl_define('api.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
--   SELECT rl_define('reports.export', 1000, per => '1 month', algorithm => 'fixed_window',
--                    time_zone => 'Europe/Berlin');
-- amount tokens per `per`: refilled continuously for 'token_bucket' (the default) and
-- 'gcra', with bursts of `burst` (default: amount); at most amount in each window of `per`
-- for 'fixed_window', 'sliding_window' and 'sliding_log' (no burst); an allowance slices a
-- hot subject's tokens to each server; max_debt bounds what a subject may owe (waits booked,
-- costs settled up) and replay_window how long a request id is remembered. On a change,
-- arguments left NULL keep their value. The table's constraints check it like any INSERT or UPDATE,
-- and the caller needs the same rights on rl_policy.
CREATE FUNCTION @extschema@.rl_define(name text, amount bigint, per interval,
                                      burst bigint DEFAULT NULL, fail_mode text DEFAULT NULL,
                                      idle_ttl interval DEFAULT NULL,
                                      local_share numeric DEFAULT NULL,
                                      algorithm text DEFAULT 'token_bucket',
                                      time_zone text DEFAULT NULL,
                                      allowance bigint DEFAULT NULL,
                                      allowance_ttl interval DEFAULT NULL,
                                      max_debt bigint DEFAULT NULL,
                                      replay_window interval DEFAULT NULL)
RETURNS @extschema@.rl_policy
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO @extschema@.rl_policy AS p
        (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share,
         time_zone, allowance, allowance_ttl, max_debt, replay_window)
    VALUES (rl_define.name, rl_define.algorithm, coalesce(rl_define.burst, rl_define.amount),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                 THEN rl_define.amount END,
            rl_define.per, rl_define.idle_ttl,
            coalesce(rl_define.fail_mode, 'closed'), coalesce(rl_define.local_share, 1),
            coalesce(rl_define.time_zone, 'UTC'), rl_define.allowance,
            coalesce(rl_define.allowance_ttl, '1 second'),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                 THEN rl_define.max_debt END,
            coalesce(rl_define.replay_window, '1 hour'))
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
        allowance_ttl = coalesce(rl_define.allowance_ttl, p.allowance_ttl),
        max_debt = CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                        THEN coalesce(rl_define.max_debt, p.max_debt) ELSE rl_define.max_debt END,
        replay_window = coalesce(rl_define.replay_window, p.replay_window)
    RETURNING *;
END;

-- A take may wait (max_wait: its turn is booked in Redis, slept through here, given back if
-- cancelled) and may be made once per request (request_id: the same id again, within the
-- policy's replay_window, gets the first grant and takes nothing).
CREATE FUNCTION @extschema@.rl_consume(policy text, subject text, cost bigint DEFAULT 1,
                                      max_wait interval DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_consume' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_consume(text, text, bigint, interval, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume(text, text, bigint, interval, text) IS
    'take cost tokens from the subject''s bucket if they are all there (waiting up to max_wait for them; once per request_id); returns the decision';

CREATE FUNCTION @extschema@.rl_enforce(policy text, subject text, cost bigint DEFAULT 1,
                                      max_wait interval DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_enforce' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_enforce(text, text, bigint, interval, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_enforce(text, text, bigint, interval, text) IS
    'like rl_consume, but a denial raises SQLSTATE RL429';

CREATE FUNCTION @extschema@.rl_reserve(policy text, subject text, cost bigint DEFAULT 1,
                                      max_wait interval DEFAULT NULL, request_id text DEFAULT NULL)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_reserve' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_reserve(text, text, bigint, interval, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_reserve(text, text, bigint, interval, text) IS
    'like rl_consume, but the tokens come back (and request_id is forgotten) if the transaction or savepoint rolls back: for writes that stay in the transaction, never for reads or exports whose effect leaves it';

CREATE FUNCTION @extschema@.rl_settle(policy text, subject text, cost bigint, actual bigint)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_settle' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_settle(text, text, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_settle(text, text, bigint, bigint) IS
    'settle a take of cost tokens to what the work really cost: less gives the difference back, more takes it even beyond what is there (owing at most max_debt); a reservation of this transaction follows';

CREATE FUNCTION @extschema@.rl_consume_all(policies text[], subjects text[], costs bigint[] DEFAULT NULL,
                                          request_id text DEFAULT NULL)
RETURNS SETOF @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_consume_all' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 2;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[], text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[], text) IS
    'several checks in one atomic step: all granted or none charged (once per request_id); subjects share a hash tag';

CREATE FUNCTION @extschema@.rl_consume_many(policy text, subjects text[], costs bigint[] DEFAULT NULL,
                                           request_ids text[] DEFAULT NULL)
RETURNS SETOF @extschema@.rl_subject_decision
AS 'MODULE_PATHNAME', 'rl_consume_many' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[], text[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[], text[]) IS
    'a decision per subject of one policy, in one round trip per Redis node; NULL costs mean 1 each; request_ids make each once per id';

CREATE FUNCTION @extschema@.rl_acquire(policy text, subject text, scope text DEFAULT 'transaction',
                                      max_wait interval DEFAULT NULL)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_acquire' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_acquire(text, text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_acquire(text, text, text, interval) IS
    'take one lease of a concurrency policy (waiting up to max_wait for one), released when the transaction (or session) ends';

-- The grants are the roles', not the extension's: the privileges the extension itself gave
-- (pg_init_privs, which pg_dump leaves out) are put back as they were before them, so that a
-- dump keeps the roles' grants as a fresh install would.
CREATE TEMPORARY TABLE rl_upgrade_init_privs AS
    SELECT i.objoid, i.initprivs FROM pg_catalog.pg_init_privs i
     WHERE i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND i.objsubid OPERATOR(pg_catalog.=) 0
       AND i.objoid OPERATOR(pg_catalog.=) ANY (SELECT n.new_signature::pg_catalog.regprocedure::pg_catalog.oid
                                                 FROM rl_upgrade_functions n);
DO $$
BEGIN
    IF pg_catalog.current_setting('rl_upgrade.grants') OPERATOR(pg_catalog.<>) '' THEN
        EXECUTE pg_catalog.current_setting('rl_upgrade.grants');
    END IF;
END
$$;
UPDATE pg_catalog.pg_init_privs i SET initprivs = b.initprivs
  FROM rl_upgrade_init_privs b
 WHERE i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
   AND i.objsubid OPERATOR(pg_catalog.=) 0 AND i.objoid OPERATOR(pg_catalog.=) b.objoid;
DELETE FROM pg_catalog.pg_init_privs i
 WHERE i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
   AND i.objsubid OPERATOR(pg_catalog.=) 0
   AND i.objoid OPERATOR(pg_catalog.=) ANY (SELECT n.new_signature::pg_catalog.regprocedure::pg_catalog.oid
                                             FROM rl_upgrade_functions n)
   AND i.objoid OPERATOR(pg_catalog.<>) ALL (SELECT b.objoid FROM rl_upgrade_init_privs b);
DROP TABLE rl_upgrade_init_privs;
DROP TABLE rl_upgrade_functions;

-- rl_stats counts replays too: made again, and what roles were granted on it granted again
-- (as the roles' grants, not the extension's, as above).
SELECT pg_catalog.set_config('rl_upgrade.stats_grants', coalesce(pg_catalog.string_agg(
           pg_catalog.format('GRANT %s ON @extschema@.rl_stats TO %s%s', a.privilege_type,
                             CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                  ELSE pg_catalog.quote_ident(r.rolname) END,
                             CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END), '; '), ''),
       true)
  FROM pg_catalog.pg_class c
 CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
  LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
 WHERE c.oid OPERATOR(pg_catalog.=) '@extschema@.rl_stats'::pg_catalog.regclass
   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
   AND a.grantee OPERATOR(pg_catalog.<>) 'pg_monitor'::pg_catalog.regrole;
DROP VIEW @extschema@.rl_stats;
DROP FUNCTION @extschema@._rl_stats_read();
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
    OUT stats_reset timestamptz,
    OUT source_replay bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_stats_read' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@._rl_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@._rl_stats_read() TO pg_monitor;

CREATE VIEW @extschema@.rl_stats AS SELECT * FROM @extschema@._rl_stats_read();
REVOKE ALL ON @extschema@.rl_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.rl_stats TO pg_monitor;
CREATE TEMPORARY TABLE rl_upgrade_init_privs AS
    SELECT i.initprivs FROM pg_catalog.pg_init_privs i
     WHERE i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
       AND i.objoid OPERATOR(pg_catalog.=) '@extschema@.rl_stats'::pg_catalog.regclass
       AND i.objsubid OPERATOR(pg_catalog.=) 0;
DO $$
BEGIN
    IF pg_catalog.current_setting('rl_upgrade.stats_grants') OPERATOR(pg_catalog.<>) '' THEN
        EXECUTE pg_catalog.current_setting('rl_upgrade.stats_grants');
    END IF;
END
$$;
UPDATE pg_catalog.pg_init_privs i SET initprivs = b.initprivs
  FROM rl_upgrade_init_privs b
 WHERE i.classoid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
   AND i.objoid OPERATOR(pg_catalog.=) '@extschema@.rl_stats'::pg_catalog.regclass
   AND i.objsubid OPERATOR(pg_catalog.=) 0;
DROP TABLE rl_upgrade_init_privs;
COMMENT ON VIEW @extschema@.rl_stats IS
    'per-policy decision counters and Redis latency of this server since the last reset; never a subject';

