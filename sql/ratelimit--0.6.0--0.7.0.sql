-- ratelimit 0.6.0 -> 0.7.0: the algorithms gcra, fixed_window, sliding_window and
-- sliding_log; the column time_zone for calendar windows; rl_define for every algorithm;
-- rl_consume_many; the deny cache (the column deny_cache, rl_stats.source_deny_cache).
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.7.0'" to load this file. \quit

-- True for exactly one month or one year: a fixed window's calendar windows (no other
-- interval with months has a length in ms).
CREATE FUNCTION @extschema@._rl_interval_is_calendar_months(period interval) RETURNS boolean
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN ((EXTRACT(year FROM period) OPERATOR(pg_catalog.*) 12) OPERATOR(pg_catalog.+) EXTRACT(month FROM period))
       OPERATOR(pg_catalog.=) ANY (ARRAY[1, 12]::numeric[])
   AND EXTRACT(day FROM period) OPERATOR(pg_catalog.=) 0
   AND EXTRACT(hour FROM period) OPERATOR(pg_catalog.=) 0
   AND EXTRACT(minute FROM period) OPERATOR(pg_catalog.=) 0
   AND EXTRACT(second FROM period) OPERATOR(pg_catalog.=) 0;

-- True for a time zone PostgreSQL knows (at most 63 bytes); an unknown one raises 22023.
CREATE FUNCTION @extschema@._rl_time_zone_is_valid(zone text) RETURNS boolean
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN pg_catalog.octet_length(zone) OPERATOR(pg_catalog.<=) 63
   AND (TIMESTAMPTZ '2000-01-01 00:00+00' AT TIME ZONE zone) IS NOT NULL;

-- The bounds of the algorithms other than the token bucket's, which keep their scripts
-- exact (src/algorithm/limit.c, gcra.h, sliding_log.h check the same): GCRA's rate
-- refill_amount / g at most 512 and its tolerance below 2^52; a sliding window's
-- capacity * window below 2^51; a sliding log's capacity at most 10,000 (one member per
-- token); a window of at most 2^52 ms.
CREATE FUNCTION @extschema@._rl_window_is_exact(algorithm text, capacity bigint, refill_amount bigint,
                                                refill_period interval)
RETURNS boolean IMMUTABLE PARALLEL SAFE LANGUAGE sql
RETURN CASE algorithm
    WHEN 'gcra' THEN
        refill_amount IS NULL OR refill_period IS NULL
        OR @extschema@._rl_interval_ms(refill_period) OPERATOR(pg_catalog.<) 1
        OR (refill_amount OPERATOR(pg_catalog./)
            pg_catalog.gcd(refill_amount::numeric, @extschema@._rl_interval_ms(refill_period)))
           OPERATOR(pg_catalog.<=) 512
           AND (capacity::numeric OPERATOR(pg_catalog.*)
                (@extschema@._rl_interval_ms(refill_period) OPERATOR(pg_catalog./)
                 pg_catalog.gcd(refill_amount::numeric, @extschema@._rl_interval_ms(refill_period))))
               OPERATOR(pg_catalog.<) (2::numeric OPERATOR(pg_catalog.^) 52)
    WHEN 'sliding_window' THEN
        refill_period IS NULL
        OR capacity::numeric OPERATOR(pg_catalog.*) @extschema@._rl_interval_ms(refill_period)
           OPERATOR(pg_catalog.<) (2::numeric OPERATOR(pg_catalog.^) 51)
    WHEN 'sliding_log' THEN
        capacity OPERATOR(pg_catalog.<=) 10000
        AND (refill_period IS NULL OR @extschema@._rl_interval_ms(refill_period)
             OPERATOR(pg_catalog.<=) 4503599627370496::numeric)
    WHEN 'fixed_window' THEN
        refill_period IS NULL OR @extschema@._rl_interval_is_calendar_months(refill_period)
        OR @extschema@._rl_interval_ms(refill_period) OPERATOR(pg_catalog.<=) 4503599627370496::numeric
    ELSE true END;

-- The new algorithms and their fields; existing rows all satisfy the new checks (they
-- are token buckets or concurrency policies, whose rules are unchanged).
ALTER TABLE @extschema@.rl_policy
    DROP CONSTRAINT rl_policy_algorithm_check,
    ADD CONSTRAINT rl_policy_algorithm_check
        CHECK (algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window',
                                                           'sliding_window', 'sliding_log',
                                                           'concurrency'])),
    DROP CONSTRAINT rl_policy_algorithm_fields_check,
    ADD CONSTRAINT rl_policy_algorithm_fields_check
        CHECK (CASE
                   WHEN algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                       THEN refill_amount IS NOT NULL AND refill_period IS NOT NULL
                   WHEN algorithm OPERATOR(pg_catalog.=) 'concurrency'
                       THEN refill_amount IS NULL AND refill_period IS NULL AND idle_ttl IS NOT NULL
                   ELSE refill_amount IS NULL AND refill_period IS NOT NULL AND idle_ttl IS NULL
               END),
    DROP CONSTRAINT rl_policy_refill_period_check,
    ADD CONSTRAINT rl_policy_refill_period_check
        CHECK (@extschema@._rl_interval_is_whole_ms(refill_period)
               OR @extschema@._rl_interval_is_calendar_months(refill_period)),
    ADD COLUMN time_zone text NOT NULL DEFAULT 'UTC'
        CONSTRAINT rl_policy_time_zone_check
        CHECK (@extschema@._rl_time_zone_is_valid(time_zone)),
    ADD COLUMN deny_cache boolean NOT NULL DEFAULT true,
    ADD CONSTRAINT rl_policy_months_check
        CHECK (algorithm OPERATOR(pg_catalog.=) 'fixed_window'
               OR NOT @extschema@._rl_interval_is_calendar_months(refill_period)),
    ADD CONSTRAINT rl_policy_time_zone_algorithm_check
        CHECK (algorithm OPERATOR(pg_catalog.=) 'fixed_window' OR time_zone OPERATOR(pg_catalog.=) 'UTC'),
    ADD CONSTRAINT rl_policy_window_bound_check
        CHECK (@extschema@._rl_window_is_exact(algorithm, capacity, refill_amount, refill_period));

-- A row's limits include its time zone (history written before 0.7 holds none: UTC).
CREATE OR REPLACE FUNCTION @extschema@._rl_limits(item jsonb) RETURNS jsonb
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN pg_catalog.jsonb_build_object(
    'algorithm', item OPERATOR(pg_catalog.->) 'algorithm', 'action', item OPERATOR(pg_catalog.->) 'action',
    'capacity', item OPERATOR(pg_catalog.->) 'capacity',
    'refill_amount', item OPERATOR(pg_catalog.->) 'refill_amount',
    'refill_period', item OPERATOR(pg_catalog.->) 'refill_period',
    'time_zone', COALESCE(item OPERATOR(pg_catalog.->) 'time_zone', '"UTC"'::jsonb));

-- A changed time zone is a new version; overrides of the new algorithms are checked.
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
    IF TG_OP = 'INSERT' THEN
        NEW.version := @extschema@._rl_inserted_version('policy', NEW.name, NULL, to_jsonb(NEW));
    ELSIF (NEW.algorithm, NEW.capacity, NEW.refill_amount, NEW.refill_period, NEW.time_zone)
          IS DISTINCT FROM (OLD.algorithm, OLD.capacity, OLD.refill_amount, OLD.refill_period, OLD.time_zone) THEN
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

CREATE OR REPLACE FUNCTION @extschema@._rl_override_set_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    algorithm text;
BEGIN
    IF TG_RELID <> '@extschema@.rl_override'::regclass THEN
        RAISE EXCEPTION '_rl_override_set_version is a trigger of rl_override only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    -- FOR SHARE: an algorithm change of the policy waits for this override, or this for it.
    SELECT p.algorithm INTO algorithm FROM @extschema@.rl_policy p WHERE p.name = NEW.policy FOR SHARE;
    -- (An unknown policy is left to the foreign key, which says so.)
    -- (A limit without a capacity is left to rl_override_action_fields_check.)
    IF NEW.action = 'limit' AND algorithm IN ('token_bucket', 'gcra') AND NEW.capacity IS NOT NULL
       AND NEW.refill_amount IS NULL THEN
        RAISE EXCEPTION 'a limit override of % policy "%" needs capacity, refill_amount and refill_period', algorithm, NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check';
    END IF;
    IF NEW.action = 'limit' AND algorithm = 'gcra'
       AND NOT @extschema@._rl_window_is_exact('gcra', NEW.capacity, NEW.refill_amount, NEW.refill_period) THEN
        RAISE EXCEPTION 'a limit override of gcra policy "%" is outside what gcra holds exactly', NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check',
                  DETAIL = 'With g = gcd(refill_amount, refill_period in ms), refill_amount / g must be at most 512 and capacity * period_ms / g below 2^52.';
    END IF;
    IF NEW.action = 'limit' AND algorithm NOT IN ('token_bucket', 'gcra') AND NEW.refill_amount IS NOT NULL THEN
        RAISE EXCEPTION '% policy "%" has no refill: a limit override sets only its capacity', algorithm, NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check';
    END IF;
    IF NEW.action = 'limit' AND NOT @extschema@._rl_window_is_exact(algorithm, NEW.capacity, NULL,
            (SELECT p.refill_period FROM @extschema@.rl_policy p WHERE p.name = NEW.policy))
       AND algorithm IN ('sliding_window', 'sliding_log') THEN
        RAISE EXCEPTION 'a limit override of % policy "%" is outside its bounds', algorithm, NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check',
                  DETAIL = 'A sliding log holds at most 10,000 tokens; a sliding window''s capacity * window_ms stays below 2^51.';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.version := @extschema@._rl_inserted_version('override', NEW.policy, NEW.subject, to_jsonb(NEW));
    ELSIF (NEW.policy, NEW.subject, NEW.action, NEW.capacity, NEW.refill_amount, NEW.refill_period)
          IS DISTINCT FROM (OLD.policy, OLD.subject, OLD.action, OLD.capacity, OLD.refill_amount, OLD.refill_period) THEN
        NEW.version := nextval('@extschema@.rl_policy_version_seq');
    ELSE
        NEW.version := OLD.version;
    END IF;
    RETURN NEW;
END
$$;

-- rl_define takes an algorithm and a time zone now: made again (it had no grants).
DROP FUNCTION @extschema@.rl_define(text, bigint, interval, bigint, text, interval, numeric);
-- Defines or changes a policy in words close to the requirement:
--   SELECT rl_define('api.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
--   SELECT rl_define('reports.export', 1000, per => '1 month', algorithm => 'fixed_window',
--                    time_zone => 'Europe/Berlin');
-- amount tokens per `per`: refilled continuously for 'token_bucket' (the default) and
-- 'gcra', with bursts of `burst` (default: amount); at most amount in each window of `per`
-- for 'fixed_window', 'sliding_window' and 'sliding_log' (no burst). On a change, arguments
-- left NULL keep their value. The table's constraints check it like any INSERT or UPDATE,
-- and the caller needs the same rights on rl_policy.
CREATE FUNCTION @extschema@.rl_define(name text, amount bigint, per interval,
                                      burst bigint DEFAULT NULL, fail_mode text DEFAULT NULL,
                                      idle_ttl interval DEFAULT NULL,
                                      local_share numeric DEFAULT NULL,
                                      algorithm text DEFAULT 'token_bucket',
                                      time_zone text DEFAULT NULL)
RETURNS @extschema@.rl_policy
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO @extschema@.rl_policy AS p
        (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share,
         time_zone)
    VALUES (rl_define.name, rl_define.algorithm, coalesce(rl_define.burst, rl_define.amount),
            CASE WHEN rl_define.algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                 THEN rl_define.amount END,
            rl_define.per, rl_define.idle_ttl,
            coalesce(rl_define.fail_mode, 'closed'), coalesce(rl_define.local_share, 1),
            coalesce(rl_define.time_zone, 'UTC'))
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
                                                      THEN p.time_zone ELSE 'UTC' END)
    RETURNING *;
END;

-- Independent decisions for many subjects of one policy, in one round trip per Redis node
-- (a row per subject, in input order: the subject, then rl_decision's fields); every
-- element is checked before anything is sent.
CREATE TYPE @extschema@.rl_subject_decision AS (
    subject        text,
    allowed        boolean,
    remaining      bigint,
    capacity       bigint,
    retry_after_ms bigint,
    reset_after_ms bigint,
    policy         text,
    version        integer,
    source         text
);
CREATE FUNCTION @extschema@.rl_consume_many(policy text, subjects text[], costs bigint[] DEFAULT NULL)
RETURNS SETOF @extschema@.rl_subject_decision
AS 'MODULE_PATHNAME', 'rl_consume_many' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[]) IS
    'a decision per subject of one policy, in one round trip per Redis node; NULL costs mean 1 each';

-- rl_stats counts the decisions of the deny cache: its function and view made again,
-- with their privileges.
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
