-- ratelimit 0.1.0 -> 0.2.0: per-subject overrides; pg_restore keeps versions and history.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.2.0'" to load this file. \quit

-- History rows now also record overrides, with their subject.
-- No primary key: pg_restore loads the dumped rows (with their ids) after the
-- restore's own inserts into rl_policy were recorded, so ids may repeat there.
-- Read the trail ordered by (at, id).
ALTER TABLE @extschema@.rl_policy_history DROP CONSTRAINT rl_policy_history_pkey;
ALTER TABLE @extschema@.rl_policy_history ADD COLUMN subject text;
ALTER TABLE @extschema@.rl_policy_history
    ADD CONSTRAINT rl_policy_history_object_check CHECK (object IN ('policy', 'override'));
CREATE INDEX rl_policy_history_name_idx ON @extschema@.rl_policy_history (name, id);
COMMENT ON TABLE @extschema@.rl_policy_history IS
    'every change of a policy or override: written by the extension';

-- Per-subject limits: a premium tenant gets more, a noisy one less ('limit'), or a
-- subject is always allowed ('allow') or always denied ('deny'), until expires_at.
-- A 'limit' override has its own version, so its bucket has its own Redis key.
CREATE TABLE @extschema@.rl_override (
    policy        text NOT NULL
                  REFERENCES @extschema@.rl_policy (name) ON UPDATE CASCADE ON DELETE CASCADE,
    subject       text NOT NULL
                  CONSTRAINT rl_override_subject_check CHECK (octet_length(subject) BETWEEN 1 AND 1024),
    action        text NOT NULL DEFAULT 'limit'
                  CONSTRAINT rl_override_action_check CHECK (action IN ('limit', 'allow', 'deny')),
    capacity      bigint CONSTRAINT rl_override_capacity_check CHECK (capacity > 0),
    refill_amount bigint CONSTRAINT rl_override_refill_amount_check CHECK (refill_amount > 0),
    refill_period interval
                  CONSTRAINT rl_override_refill_period_check
                  CHECK (@extschema@.rl_interval_is_whole_ms(refill_period)),
    expires_at    timestamptz,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    version       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, subject),
    -- 'limit' sets a capacity (and, for a token bucket, a refill); 'allow' and 'deny' set none.
    CONSTRAINT rl_override_action_fields_check
        CHECK (CASE action
                   WHEN 'limit' THEN capacity IS NOT NULL
                                     AND (refill_amount IS NULL) = (refill_period IS NULL)
                   ELSE capacity IS NULL AND refill_amount IS NULL AND refill_period IS NULL
               END),
    -- Compared with created_at, not now(): a dumped override that has expired since
    -- still restores, while a new one cannot be born expired.
    CONSTRAINT rl_override_expiry_check CHECK (expires_at IS NULL OR expires_at > created_at),
    CONSTRAINT rl_override_exact_check
        CHECK (@extschema@.rl_bucket_is_exact(capacity, refill_amount, refill_period))
);
COMMENT ON TABLE @extschema@.rl_override IS
    'per-subject limits of a policy: another limit, always allow or always deny, until expires_at';

-- The part of a policy or override row (as jsonb) that gives meaning to its bucket state.
CREATE FUNCTION @extschema@.rl_limits(item jsonb) RETURNS jsonb
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN jsonb_build_object('algorithm', item -> 'algorithm', 'action', item -> 'action',
                          'capacity', item -> 'capacity', 'refill_amount', item -> 'refill_amount',
                          'refill_period', item -> 'refill_period');

-- The version an inserted row gets. A row that a superuser inserts with one (pg_restore does)
-- keeps it when no row ever recorded with that name and version had other limits, so the
-- restored policy finds its own buckets and nothing can misread another's; otherwise, and
-- for everyone else, a new version. A version kept moves the sequence past it, so none is
-- issued twice.
CREATE FUNCTION @extschema@.rl_inserted_version(object text, name text, subject text, item jsonb)
RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    supplied integer := (item ->> 'version')::integer;
BEGIN
    IF supplied IS NULL OR supplied <= 0
       OR NOT coalesce((SELECT r.rolsuper FROM pg_roles r
                        WHERE r.rolname = coalesce(nullif(current_setting('role'), 'none'),
                                                   session_user::text)), false)
       OR EXISTS (
        SELECT FROM @extschema@.rl_policy_history h
        WHERE h.name = rl_inserted_version.name AND h.new IS NOT NULL
          AND (h.new ->> 'version')::integer = supplied
          AND (h.object, h.subject, @extschema@.rl_limits(h.new))
              IS DISTINCT FROM (rl_inserted_version.object, rl_inserted_version.subject,
                                @extschema@.rl_limits(item)))
       OR EXISTS (SELECT FROM @extschema@.rl_override o
                  WHERE o.policy = rl_inserted_version.name AND o.version = supplied
                    AND (object, o.subject) IS DISTINCT FROM ('override', rl_inserted_version.subject))
       OR EXISTS (SELECT FROM @extschema@.rl_policy p
                  WHERE p.name = rl_inserted_version.name AND p.version = supplied
                    AND object <> 'policy') THEN
        RETURN nextval('@extschema@.rl_policy_version_seq');
    END IF;
    IF supplied > (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
                   FROM @extschema@.rl_policy_version_seq) THEN
        PERFORM setval('@extschema@.rl_policy_version_seq', supplied);
    END IF;
    RETURN supplied;
END
$$;

-- Sets a policy's version (see rl_inserted_version for an inserted row that brings one);
-- refuses an algorithm change that its 'limit' overrides could not follow.
CREATE OR REPLACE FUNCTION @extschema@.rl_policy_set_version() RETURNS trigger
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
        NEW.version := @extschema@.rl_inserted_version('policy', NEW.name, NULL, to_jsonb(NEW));
    ELSIF (NEW.algorithm, NEW.capacity, NEW.refill_amount, NEW.refill_period)
          IS DISTINCT FROM (OLD.algorithm, OLD.capacity, OLD.refill_amount, OLD.refill_period) THEN
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

-- Checks an override against its policy's algorithm and sets its version: a new one on
-- insert and whenever action, capacity or refill change, otherwise the old one.
CREATE FUNCTION @extschema@.rl_override_set_version() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    algorithm text;
BEGIN
    IF TG_RELID <> '@extschema@.rl_override'::regclass THEN
        RAISE EXCEPTION 'rl_override_set_version is a trigger of rl_override only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    -- FOR SHARE: an algorithm change of the policy waits for this override, or this for it.
    SELECT p.algorithm INTO algorithm FROM @extschema@.rl_policy p WHERE p.name = NEW.policy FOR SHARE;
    -- (An unknown policy is left to the foreign key, which says so.)
    -- (A limit without a capacity is left to rl_override_action_fields_check.)
    IF NEW.action = 'limit' AND algorithm = 'token_bucket' AND NEW.capacity IS NOT NULL
       AND NEW.refill_amount IS NULL THEN
        RAISE EXCEPTION 'a limit override of token-bucket policy "%" needs capacity, refill_amount and refill_period', NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check';
    END IF;
    IF NEW.action = 'limit' AND algorithm = 'concurrency' AND NEW.refill_amount IS NOT NULL THEN
        RAISE EXCEPTION 'concurrency policy "%" has no refill: a limit override sets only its capacity', NEW.policy
            USING ERRCODE = 'check_violation', CONSTRAINT = 'rl_override_algorithm_check';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.version := @extschema@.rl_inserted_version('override', NEW.policy, NEW.subject, to_jsonb(NEW));
    ELSIF (NEW.policy, NEW.subject, NEW.action, NEW.capacity, NEW.refill_amount, NEW.refill_period)
          IS DISTINCT FROM (OLD.policy, OLD.subject, OLD.action, OLD.capacity, OLD.refill_amount, OLD.refill_period) THEN
        NEW.version := nextval('@extschema@.rl_policy_version_seq');
    ELSE
        NEW.version := OLD.version;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER rl_override_set_version
    BEFORE INSERT OR UPDATE ON @extschema@.rl_override
    FOR EACH ROW EXECUTE FUNCTION @extschema@.rl_override_set_version();

CREATE TRIGGER rl_override_invalidate
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.rl_override
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.rl_policy_invalidate();

-- Records one change of a policy or an override (see 0.1.0), now with the object and subject.
CREATE OR REPLACE FUNCTION @extschema@.rl_policy_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    who text := coalesce(nullif(current_setting('role'), 'none'), session_user::text);
    object text;
    item jsonb;
BEGIN
    IF TG_RELID = '@extschema@.rl_policy'::regclass THEN
        object := 'policy';
    ELSIF TG_RELID = '@extschema@.rl_override'::regclass THEN
        object := 'override';
    ELSE
        RAISE EXCEPTION 'rl_policy_record is a trigger of rl_policy and rl_override only'
            USING ERRCODE = 'trigger_protocol_violated';
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        -- Before the truncate the rows are still there: record each.
        FOR item IN EXECUTE format('SELECT to_jsonb(t) FROM %s t', TG_RELID::regclass) LOOP
            INSERT INTO @extschema@.rl_policy_history (role, action, object, name, subject, old)
            VALUES (who, 'TRUNCATE', object, coalesce(item ->> 'name', item ->> 'policy'),
                    item ->> 'subject', item);
        END LOOP;
        RETURN NULL;
    END IF;
    item := CASE WHEN TG_OP = 'DELETE' THEN to_jsonb(OLD) ELSE to_jsonb(NEW) END;
    INSERT INTO @extschema@.rl_policy_history (role, action, object, name, subject, old, new)
    VALUES (who, TG_OP, object, coalesce(item ->> 'name', item ->> 'policy'), item ->> 'subject',
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
    RETURN NULL;
END
$$;

CREATE TRIGGER rl_override_record
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.rl_override
    FOR EACH ROW EXECUTE FUNCTION @extschema@.rl_policy_record();
CREATE TRIGGER rl_override_record_truncate
    BEFORE TRUNCATE ON @extschema@.rl_override
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.rl_policy_record();

SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_override', '');

REVOKE ALL ON @extschema@.rl_override FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_limits(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_inserted_version(text, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.rl_override_set_version() FROM PUBLIC;
