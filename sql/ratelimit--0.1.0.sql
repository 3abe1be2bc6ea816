-- ratelimit 0.1.0: policies as rows, decisions from a token bucket in Redis.
\echo Use "CREATE EXTENSION ratelimit" to load this file. \quit

-- Milliseconds in an interval without a month part (months have no fixed length).
-- A SQL-standard body is bound when created, so search_path cannot redirect it.
CREATE FUNCTION @extschema@.rl_interval_ms(period interval) RETURNS numeric
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN extract(epoch FROM period) * 1000;

-- True when an interval is a whole, positive number of milliseconds with no month part.
CREATE FUNCTION @extschema@.rl_interval_is_whole_ms(period interval) RETURNS boolean
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN extract(month FROM period) = 0 AND extract(year FROM period) = 0
   AND @extschema@.rl_interval_ms(period) >= 1
   AND @extschema@.rl_interval_ms(period) = trunc(@extschema@.rl_interval_ms(period));

-- True when the bucket's integer arithmetic stays exact in Redis's Lua (doubles):
-- with g = gcd(refill_amount, period_ms), capacity * period_ms / g + refill_amount / g
-- must stay below 2^53. bucket.c checks the same bound.
CREATE FUNCTION @extschema@.rl_bucket_is_exact(capacity bigint, refill_amount bigint, refill_period interval)
RETURNS boolean IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN CASE WHEN refill_amount > 0 AND @extschema@.rl_interval_ms(refill_period) >= 1 THEN
    capacity::numeric * (@extschema@.rl_interval_ms(refill_period)
                         / gcd(refill_amount::numeric, @extschema@.rl_interval_ms(refill_period)))
    + refill_amount / gcd(refill_amount::numeric, @extschema@.rl_interval_ms(refill_period))
    < 2::numeric ^ 53 END;

-- Milliseconds an empty bucket needs to refill completely, rounded up.
-- (Both functions leave non-positive input to the table's own checks: NULL passes.)
CREATE FUNCTION @extschema@.rl_refill_ms(capacity bigint, refill_amount bigint, refill_period interval)
RETURNS numeric IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN CASE WHEN refill_amount > 0 THEN
    ceil(capacity::numeric * @extschema@.rl_interval_ms(refill_period) / refill_amount) END;

-- Versions come from one sequence, so a version is never reused, not even by a policy
-- that is dropped and created again.
CREATE SEQUENCE @extschema@.rl_policy_version_seq AS integer;

CREATE TABLE @extschema@.rl_policy (
    name          text PRIMARY KEY
                  CONSTRAINT rl_policy_name_check CHECK (name ~ '^[a-z0-9_.-]{1,63}$'),
    algorithm     text NOT NULL DEFAULT 'token_bucket'
                  CONSTRAINT rl_policy_algorithm_check CHECK (algorithm IN ('token_bucket', 'concurrency')),
    capacity      bigint NOT NULL CONSTRAINT rl_policy_capacity_check CHECK (capacity > 0),
    refill_amount bigint CONSTRAINT rl_policy_refill_amount_check CHECK (refill_amount > 0),
    refill_period interval
                  CONSTRAINT rl_policy_refill_period_check
                  CHECK (@extschema@.rl_interval_is_whole_ms(refill_period)),
    idle_ttl      interval,
    fail_mode     text NOT NULL DEFAULT 'closed'
                  CONSTRAINT rl_policy_fail_mode_check CHECK (fail_mode IN ('open', 'closed', 'local')),
    mode          text NOT NULL DEFAULT 'enforce'
                  CONSTRAINT rl_policy_mode_check CHECK (mode IN ('enforce', 'shadow', 'disabled')),
    local_share   numeric NOT NULL DEFAULT 1
                  CONSTRAINT rl_policy_local_share_check CHECK (local_share >= 0.000001 AND local_share <= 1),
    version       integer NOT NULL DEFAULT 0,
    -- A token bucket refills; a concurrency policy holds leases, each living at most
    -- idle_ttl (the backstop for a holder that dies), and has no refill.
    CONSTRAINT rl_policy_algorithm_fields_check
        CHECK (CASE algorithm
                   WHEN 'token_bucket' THEN refill_amount IS NOT NULL AND refill_period IS NOT NULL
                   ELSE refill_amount IS NULL AND refill_period IS NULL AND idle_ttl IS NOT NULL
               END),
    CONSTRAINT rl_policy_idle_ttl_check
        CHECK (idle_ttl IS NULL
               OR @extschema@.rl_interval_is_whole_ms(idle_ttl) AND @extschema@.rl_interval_ms(idle_ttl)
                   >= @extschema@.rl_refill_ms(capacity, refill_amount, refill_period)),
    CONSTRAINT rl_policy_exact_check
        CHECK (@extschema@.rl_bucket_is_exact(capacity, refill_amount, refill_period))
);

COMMENT ON TABLE @extschema@.rl_policy IS 'rate limit policies: one row per limit';
COMMENT ON COLUMN @extschema@.rl_policy.version IS
    'bumped by the extension when a change alters the meaning of stored bucket state';

-- True when local fallback buckets exist (ratelimit is in shared_preload_libraries).
CREATE FUNCTION @extschema@.rl_local_available() RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_local_available' LANGUAGE C STABLE PARALLEL SAFE;

-- Sets version: a new one on insert and whenever algorithm, capacity or refill change;
-- otherwise the old one, whatever the statement said. Warns when a 'local' policy has
-- no local bucket to fall back on. SECURITY DEFINER so that policy administrators need
-- no right on the sequence.
CREATE FUNCTION @extschema@.rl_policy_set_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_RELID <> '@extschema@.rl_policy'::regclass THEN
        RAISE EXCEPTION 'rl_policy_set_version is a trigger of rl_policy only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF NEW.fail_mode = 'local' AND (TG_OP = 'INSERT' OR OLD.fail_mode <> 'local')
       AND NOT @extschema@.rl_local_available() THEN
        RAISE WARNING 'policy "%" falls back to closed, not local, while Redis cannot answer', NEW.name
            USING DETAIL = 'Local fallback buckets live in shared memory: ratelimit is not in shared_preload_libraries.',
                  HINT = 'Add ratelimit to shared_preload_libraries and restart the server.';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.version := nextval('@extschema@.rl_policy_version_seq');
    ELSIF (NEW.algorithm, NEW.capacity, NEW.refill_amount, NEW.refill_period)
          IS DISTINCT FROM (OLD.algorithm, OLD.capacity, OLD.refill_amount, OLD.refill_period) THEN
        NEW.version := nextval('@extschema@.rl_policy_version_seq');
    ELSE
        NEW.version := OLD.version;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER rl_policy_set_version
    BEFORE INSERT OR UPDATE ON @extschema@.rl_policy
    FOR EACH ROW EXECUTE FUNCTION @extschema@.rl_policy_set_version();

-- Tells every backend to drop its cached policies when the transaction commits.
CREATE FUNCTION @extschema@.rl_policy_invalidate() RETURNS trigger
AS 'MODULE_PATHNAME', 'rl_policy_invalidate' LANGUAGE C;

CREATE TRIGGER rl_policy_invalidate
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.rl_policy
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.rl_policy_invalidate();

-- The audit trail: every insert, update, delete and truncate of a policy, with the old
-- and new rows, the role, the time and the transaction. Written by the extension only.
CREATE SEQUENCE @extschema@.rl_policy_history_id_seq;
CREATE TABLE @extschema@.rl_policy_history (
    id        bigint PRIMARY KEY DEFAULT nextval('@extschema@.rl_policy_history_id_seq'),
    at        timestamptz NOT NULL DEFAULT now(),
    role      text NOT NULL,
    xid       xid8 NOT NULL DEFAULT pg_current_xact_id(),
    action    text NOT NULL CHECK (action IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE')),
    object    text NOT NULL DEFAULT 'policy',
    name      text NOT NULL,
    old       jsonb,
    new       jsonb
);
ALTER SEQUENCE @extschema@.rl_policy_history_id_seq OWNED BY @extschema@.rl_policy_history.id;
COMMENT ON TABLE @extschema@.rl_policy_history IS 'every change of a policy: written by the extension';

-- Records one change. SECURITY DEFINER: no role needs (or gets) a right on the history.
-- The role recorded is the one that made the change (SET ROLE, else the session's).
CREATE FUNCTION @extschema@.rl_policy_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who text := coalesce(nullif(current_setting('role'), 'none'), session_user::text);
    row record;
BEGIN
    IF TG_RELID <> '@extschema@.rl_policy'::regclass THEN
        RAISE EXCEPTION 'rl_policy_record is a trigger of rl_policy only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        -- Before the truncate the rows are still there: record each.
        FOR row IN SELECT * FROM @extschema@.rl_policy LOOP
            INSERT INTO @extschema@.rl_policy_history (role, action, name, old)
            VALUES (who, 'TRUNCATE', row.name, to_jsonb(row));
        END LOOP;
        RETURN NULL;
    END IF;
    INSERT INTO @extschema@.rl_policy_history (role, action, name, old, new)
    VALUES (who, TG_OP, CASE WHEN TG_OP = 'DELETE' THEN OLD.name ELSE NEW.name END,
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
    RETURN NULL;
END
$$;

CREATE TRIGGER rl_policy_record
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.rl_policy
    FOR EACH ROW EXECUTE FUNCTION @extschema@.rl_policy_record();
CREATE TRIGGER rl_policy_record_truncate
    BEFORE TRUNCATE ON @extschema@.rl_policy
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.rl_policy_record();

-- Defines or changes a token-bucket policy in words close to the requirement:
--   SELECT rl_define('api.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
-- amount tokens per `per`, bursts of `burst` (default: amount). On a change, arguments left
-- NULL keep their value. The table's constraints check it like any INSERT or UPDATE, and the
-- caller needs the same rights on rl_policy.
CREATE FUNCTION @extschema@.rl_define(name text, amount bigint, per interval,
                                      burst bigint DEFAULT NULL, fail_mode text DEFAULT NULL,
                                      idle_ttl interval DEFAULT NULL,
                                      local_share numeric DEFAULT NULL)
RETURNS @extschema@.rl_policy
LANGUAGE sql
BEGIN ATOMIC
    INSERT INTO @extschema@.rl_policy AS p
        (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share)
    VALUES (rl_define.name, 'token_bucket', coalesce(rl_define.burst, rl_define.amount),
            rl_define.amount, rl_define.per, rl_define.idle_ttl,
            coalesce(rl_define.fail_mode, 'closed'), coalesce(rl_define.local_share, 1))
    ON CONFLICT (name) DO UPDATE
    SET algorithm = 'token_bucket',
        capacity = coalesce(rl_define.burst, rl_define.amount),
        refill_amount = rl_define.amount,
        refill_period = rl_define.per,
        idle_ttl = coalesce(rl_define.idle_ttl, p.idle_ttl),
        fail_mode = coalesce(rl_define.fail_mode, p.fail_mode),
        local_share = coalesce(rl_define.local_share, p.local_share)
    RETURNING *;
END;

-- pg_dump keeps the user's policies and the version counter.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_version_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_history', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_history_id_seq', '');

CREATE TYPE @extschema@.rl_decision AS (
    allowed        boolean,
    remaining      bigint,
    capacity       bigint,
    retry_after_ms bigint,
    reset_after_ms bigint,
    policy         text,
    version        integer,
    source         text
);

CREATE FUNCTION @extschema@.rl_consume(policy text, subject text, cost bigint DEFAULT 1)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_consume' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_enforce(policy text, subject text, cost bigint DEFAULT 1)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_enforce' LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The limiter's health: Redis reachable or not (since when), the breaker, the local buckets.
-- Without shared_preload_libraries it is this session's own view (shared = false).
CREATE FUNCTION @extschema@.rl_health(
    OUT redis_reachable boolean,
    OUT since timestamptz,
    OUT breaker text,
    OUT retry_in_ms bigint,
    OUT last_error text,
    OUT local_buckets_in_use integer,
    OUT local_buckets integer,
    OUT shared boolean)
AS 'MODULE_PATHNAME', 'rl_health' LANGUAGE C VOLATILE PARALLEL RESTRICTED;

CREATE FUNCTION @extschema@.rl_reserve(policy text, subject text, cost bigint DEFAULT 1)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_reserve' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_peek(policy text, subject text, cost bigint DEFAULT 1)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_peek' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_refund(policy text, subject text, amount bigint)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_refund' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_reset(policy text, subject text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_acquire(policy text, subject text, scope text DEFAULT 'transaction')
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_acquire' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_release(policy text, subject text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_release' LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.rl_consume_all(policies text[], subjects text[], costs bigint[] DEFAULT NULL)
RETURNS SETOF @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_consume_all' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 2;

CREATE FUNCTION @extschema@.rl_limit_trigger() RETURNS trigger
AS 'MODULE_PATHNAME', 'rl_limit_trigger' LANGUAGE C;

COMMENT ON FUNCTION @extschema@.rl_limit_trigger() IS
    'trigger: charge a policy per row written (or once per subject for a statement), raise when denied';
COMMENT ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[]) IS
    'several checks in one atomic step: all granted or none charged; subjects share a hash tag';
COMMENT ON FUNCTION @extschema@.rl_acquire(text, text, text) IS
    'take one lease of a concurrency policy, released when the transaction (or session) ends';
COMMENT ON FUNCTION @extschema@.rl_release(text, text) IS
    'give back the latest lease this session holds for the policy and subject';
COMMENT ON FUNCTION @extschema@.rl_reserve(text, text, bigint) IS
    'like rl_consume, but the tokens come back if the transaction or savepoint rolls back';
COMMENT ON FUNCTION @extschema@.rl_peek(text, text, bigint) IS
    'the decision rl_consume would make, taking nothing';
COMMENT ON FUNCTION @extschema@.rl_refund(text, text, bigint) IS
    'give tokens back to the subject''s bucket, never above capacity';
COMMENT ON FUNCTION @extschema@.rl_reset(text, text) IS
    'make the subject''s bucket full again; false when Redis could not answer';

COMMENT ON FUNCTION @extschema@.rl_consume(text, text, bigint) IS
    'take cost tokens from the subject''s bucket if they are all there; returns the decision';
COMMENT ON FUNCTION @extschema@.rl_enforce(text, text, bigint) IS
    'like rl_consume, but a denial raises SQLSTATE RL429';

-- Spending budget is a privilege: the owner grants it to the roles that need it.
REVOKE ALL ON FUNCTION @extschema@.rl_consume(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_enforce(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_reserve(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_peek(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_refund(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_reset(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_acquire(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_limit_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_release(text, text) FROM PUBLIC;
REVOKE ALL ON @extschema@.rl_policy FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.rl_policy_version_seq FROM PUBLIC;
-- Health is for monitoring: pg_monitor members (and roles granted EXECUTE) may read it.
REVOKE ALL ON FUNCTION @extschema@.rl_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rl_health() TO pg_monitor;
REVOKE ALL ON FUNCTION @extschema@.rl_local_available() FROM PUBLIC;
REVOKE ALL ON @extschema@.rl_policy_history FROM PUBLIC;
REVOKE ALL ON SEQUENCE @extschema@.rl_policy_history_id_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_policy_record() FROM PUBLIC;
-- Nobody may attach the trigger functions to a table of their own.
REVOKE ALL ON FUNCTION @extschema@.rl_policy_set_version() FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_policy_invalidate() FROM PUBLIC;
