-- ratelimit 0.11.0 -> 0.12.0: fixed windows that roll unused budget over (the policy
-- column rollover), the usage of a subject (rl_usage) and the subjects most limited
-- (rl_top).
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.12.0'" to load this file. \quit

ALTER TABLE @extschema@.rl_policy
    ADD COLUMN rollover bigint,
    ADD CONSTRAINT rl_policy_rollover_check
        CHECK (rollover IS NULL
               OR algorithm OPERATOR(pg_catalog.=) 'fixed_window' AND region_mode IS DISTINCT FROM 'split'
                  AND rollover OPERATOR(pg_catalog.>=) 0 AND rollover OPERATOR(pg_catalog.<=) capacity
                  AND rollover OPERATOR(pg_catalog.<) (9007199254740992::bigint OPERATOR(pg_catalog.-) capacity));
COMMENT ON CONSTRAINT rl_policy_rollover_check ON @extschema@.rl_policy IS
    'rollover is NULL (none) or, for fixed_window policies not split across regions, a number of tokens from 0 to the capacity, with capacity + rollover below 2^53.';

-- A change of rollover is a new version: what a window holds means something else.
CREATE OR REPLACE FUNCTION @extschema@._rl_policy_set_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> '@extschema@.rl_policy'::regclass THEN
        RAISE EXCEPTION '_rl_policy_set_version is a trigger of rl_policy only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF NEW.fail_mode = 'local' AND (TG_OP = 'INSERT' OR OLD.fail_mode <> 'local')
       AND NOT @extschema@._rl_local_available() THEN
        RAISE WARNING 'policy "%" falls back to closed, not local, while Redis cannot answer', NEW.name
            USING DETAIL = 'Local fallback buckets live in shared memory: ratelimit is not in shared_preload_libraries.',
                  HINT = 'Add ratelimit to shared_preload_libraries and restart the server.';
    END IF;
    -- ratelimit.allowance_size is the library's only when preloaded.
    IF NEW.allowance IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.allowance IS NULL)
       AND (NOT @extschema@._rl_local_available()
            OR coalesce(current_setting('ratelimit.allowance_size', true), '0') = '0') THEN
        RAISE WARNING 'policy "%" takes no slices: every decision asks Redis', NEW.name
            USING DETAIL = 'Slices live in shared memory: ratelimit is not in shared_preload_libraries, or ratelimit.allowance_size is 0.',
                  HINT = 'Add ratelimit to shared_preload_libraries (and give ratelimit.allowance_size slots), then restart the server.';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.version := @extschema@._rl_inserted_version('policy', NEW.name, NULL, to_jsonb(NEW));
    ELSIF (NEW.algorithm, NEW.capacity, NEW.refill_amount, NEW.refill_period, NEW.time_zone,
           NEW.region_mode, NEW.home_region, NEW.region_base, NEW.rollover)
          IS DISTINCT FROM (OLD.algorithm, OLD.capacity, OLD.refill_amount, OLD.refill_period, OLD.time_zone,
                            OLD.region_mode, OLD.home_region, OLD.region_base, OLD.rollover) THEN
        IF NEW.algorithm <> OLD.algorithm AND EXISTS (
            SELECT FROM @extschema@.rl_override o WHERE o.policy = OLD.name AND o.action = 'limit') THEN
            RAISE EXCEPTION 'policy "%" has limit overrides that only fit algorithm "%"', OLD.name, OLD.algorithm
                USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check',
                      HINT = 'Delete or change its overrides with action ''limit'' first.';
        END IF;
        NEW.version := nextval('@extschema@.rl_policy_version_seq');
    ELSE
        NEW.version := OLD.version;
    END IF;
    RETURN NEW;
END
$$;

-- What gives a version its meaning, compared when a restore brings a row back with its
-- version: the region columns (0.11.0) and rollover too.
CREATE OR REPLACE FUNCTION @extschema@._rl_limits(item jsonb) RETURNS jsonb
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN pg_catalog.jsonb_build_object(
    'algorithm', item OPERATOR(pg_catalog.->) 'algorithm', 'action', item OPERATOR(pg_catalog.->) 'action',
    'capacity', item OPERATOR(pg_catalog.->) 'capacity',
    'refill_amount', item OPERATOR(pg_catalog.->) 'refill_amount',
    'refill_period', item OPERATOR(pg_catalog.->) 'refill_period',
    'time_zone', COALESCE(item OPERATOR(pg_catalog.->) 'time_zone', '"UTC"'::jsonb),
    'region_mode', item OPERATOR(pg_catalog.->) 'region_mode',
    'home_region', item OPERATOR(pg_catalog.->) 'home_region',
    'region_base', item OPERATOR(pg_catalog.->) 'region_base',
    'rollover', item OPERATOR(pg_catalog.->) 'rollover');

-- rl_define takes rollover: made again (an added argument with a default would make every
-- call of the old one ambiguous). What a role was granted on the old one is granted on the
-- new one, and a REVOKE from PUBLIC kept.
CREATE TEMPORARY TABLE rl_upgrade_functions (old_signature text, new_signature text);
INSERT INTO rl_upgrade_functions VALUES
    ('@extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval, bigint, interval)',
     '@extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval, bigint, interval, bigint)');
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

DROP FUNCTION @extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval, bigint, interval);

-- Defines or changes a policy in words close to the requirement:
--   SELECT rl_define('api.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
--   SELECT rl_define('reports.export', 1000, per => '1 month', algorithm => 'fixed_window',
--                    time_zone => 'Europe/Berlin');
-- amount tokens per `per`: refilled continuously for 'token_bucket' (the default) and
-- 'gcra', with bursts of `burst` (default: amount); at most amount in each window of `per`
-- for 'fixed_window', 'sliding_window' and 'sliding_log' (no burst); an allowance slices a
-- hot subject's tokens to each server; max_debt bounds what a subject may owe (waits booked,
-- costs settled up), replay_window how long a request id is remembered and rollover how
-- much of a fixed window's unused budget carries into the next. On a change,
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
                                      replay_window interval DEFAULT NULL,
                                      rollover bigint DEFAULT NULL)
RETURNS @extschema@.rl_policy
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO @extschema@.rl_policy AS p
        (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share,
         time_zone, allowance, allowance_ttl, max_debt, replay_window, rollover)
    VALUES (rl_define.name, rl_define.algorithm, coalesce(rl_define.burst, rl_define.amount),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                 THEN rl_define.amount END,
            rl_define.per, rl_define.idle_ttl,
            coalesce(rl_define.fail_mode, 'closed'), coalesce(rl_define.local_share, 1),
            coalesce(rl_define.time_zone, 'UTC'), rl_define.allowance,
            coalesce(rl_define.allowance_ttl, '1 second'),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                 THEN rl_define.max_debt END,
            coalesce(rl_define.replay_window, '1 hour'),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) 'fixed_window' THEN rl_define.rollover END)
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
        replay_window = coalesce(rl_define.replay_window, p.replay_window),
        rollover = CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) 'fixed_window'
                        THEN coalesce(rl_define.rollover, p.rollover) ELSE rl_define.rollover END
    RETURNING *;
END;

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

-- How much of its limit a subject has used, read by its peek (nothing taken): a fixed
-- window's limit counts what it carried over; reset is when it is full again. NULL numbers
-- when Redis did not answer (source says who did). The array form reads many subjects in
-- one round trip per Redis node.
CREATE FUNCTION @extschema@.rl_usage(policy text, subject text)
RETURNS TABLE (used bigint, "limit" bigint, fraction double precision, reset timestamptz,
               source text)
AS 'MODULE_PATHNAME', 'rl_usage_one' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;
REVOKE ALL ON FUNCTION @extschema@.rl_usage(text, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_usage(text, text) IS
    'how much of its limit a subject has used: used, limit, fraction, reset; nothing taken';
CREATE FUNCTION @extschema@.rl_usage(policy text, subjects text[])
RETURNS TABLE (subject text, used bigint, "limit" bigint, fraction double precision,
               reset timestamptz, source text)
AS 'MODULE_PATHNAME', 'rl_usage' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
REVOKE ALL ON FUNCTION @extschema@.rl_usage(text, text[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_usage(text, text[]) IS
    'rl_usage of many subjects of one policy in one round trip, a row each in input order';

-- The subjects of a policy most denied and most served lately on this server: for each kind
-- ('denied': denials by the policy, 'taken': tokens granted), ranked by count, which is at
-- most error above the subject's true weight; no subject missing weighs more than
-- total / ratelimit.top_size. The subject itself only for roles that may read rl_override
-- (which holds subjects); others see its keyed hash, as the decision log writes it.
CREATE FUNCTION @extschema@.rl_top(policy text)
RETURNS TABLE (kind text, rank integer, subject text, subject_hash text, count bigint,
               error bigint, total bigint)
AS 'MODULE_PATHNAME', 'rl_top' LANGUAGE C VOLATILE PARALLEL RESTRICTED ROWS 64;
REVOKE ALL ON FUNCTION @extschema@.rl_top(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rl_top(text) TO pg_monitor;
COMMENT ON FUNCTION @extschema@.rl_top(text) IS
    'the subjects of a policy most denied and most served lately on this server (subjects only for roles that may read rl_override)';
