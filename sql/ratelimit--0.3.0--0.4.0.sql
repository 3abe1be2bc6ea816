-- ratelimit 0.3.0 -> 0.4.0: an installation id in the keys, bounds Redis can hold,
-- history ids that stay unique across a restore.
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path, where an
-- untrusted role may have put look-alikes.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.4.0'" to load this file. \quit

-- Functions that only the extension's own tables, constraints and views call are named
-- _rl_*, apart from the public rl_* API. Triggers, constraints and the view follow a
-- renamed function by itself; the PL/pgSQL bodies that call one by name are replaced
-- below, with the new names in their messages.
ALTER FUNCTION @extschema@.rl_interval_ms(interval) RENAME TO _rl_interval_ms;
ALTER FUNCTION @extschema@.rl_interval_is_whole_ms(interval) RENAME TO _rl_interval_is_whole_ms;
ALTER FUNCTION @extschema@.rl_bucket_is_exact(bigint, bigint, interval) RENAME TO _rl_bucket_is_exact;
ALTER FUNCTION @extschema@.rl_refill_ms(bigint, bigint, interval) RENAME TO _rl_refill_ms;
ALTER FUNCTION @extschema@.rl_local_available() RENAME TO _rl_local_available;
ALTER FUNCTION @extschema@.rl_limits(jsonb) RENAME TO _rl_limits;
ALTER FUNCTION @extschema@.rl_inserted_version(text, text, text, jsonb) RENAME TO _rl_inserted_version;
ALTER FUNCTION @extschema@.rl_policy_record() RENAME TO _rl_policy_record;
ALTER FUNCTION @extschema@.rl_policy_set_version() RENAME TO _rl_policy_set_version;
ALTER FUNCTION @extschema@.rl_override_set_version() RENAME TO _rl_override_set_version;
ALTER FUNCTION @extschema@.rl_policy_invalidate() RENAME TO _rl_policy_invalidate;
ALTER FUNCTION @extschema@.rl_stats_read() RENAME TO _rl_stats_read;
-- (The view's columns are named after the function it reads: made again, they follow.)
CREATE OR REPLACE VIEW @extschema@.rl_stats AS SELECT * FROM @extschema@._rl_stats_read();

-- Versions start again at 1 when the extension is dropped and created again, so every
-- key also names the installation: a random id chosen when the extension is created,
-- kept by pg_dump (a restored database reads the same buckets). An installation
-- upgraded from 0.3.0 that holds policies keeps id 0, which leaves its keys (and its
-- buckets) as they were; one without any gets an id of its own. The sequence is only a
-- dumpable place for one number: nothing calls nextval on it.
CREATE SEQUENCE @extschema@.rl_installation_seq AS bigint MINVALUE 0 START 0;
SELECT pg_catalog.setval('@extschema@.rl_installation_seq',
       CASE WHEN EXISTS (SELECT FROM @extschema@.rl_policy) THEN 0
            ELSE GREATEST(1, ('x' || pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::text), 1, 12))::bit(48)::bigint)
       END, true);
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_installation_seq', '');
REVOKE ALL ON SEQUENCE @extschema@.rl_installation_seq FROM PUBLIC;
COMMENT ON SEQUENCE @extschema@.rl_installation_seq IS
    'the id of this installation of the extension, part of every Redis key; never advanced';

-- What the scripts cannot hold exactly (Lua numbers are doubles): a capacity of 2^53 or
-- more, an idle_ttl over 2^52 ms (about 142,000 years, so that now + TTL stays exact).
-- Rows that break them already fail every decision; they are reported, not refused, so
-- that the update itself never fails.
ALTER TABLE @extschema@.rl_policy
    ADD CONSTRAINT rl_policy_capacity_bound_check
        CHECK (capacity OPERATOR(pg_catalog.<) 9007199254740992::bigint) NOT VALID,
    ADD CONSTRAINT rl_policy_idle_ttl_bound_check
        CHECK (idle_ttl IS NULL OR @extschema@._rl_interval_ms(idle_ttl)
               OPERATOR(pg_catalog.<=) 4503599627370496::numeric) NOT VALID;
ALTER TABLE @extschema@.rl_override
    ADD CONSTRAINT rl_override_capacity_bound_check
        CHECK (capacity OPERATOR(pg_catalog.<) 9007199254740992::bigint) NOT VALID;
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN VALUES ('@extschema@.rl_policy', 'rl_policy_capacity_bound_check'),
                       ('@extschema@.rl_policy', 'rl_policy_idle_ttl_bound_check'),
                       ('@extschema@.rl_override', 'rl_override_capacity_bound_check') LOOP
        BEGIN
            EXECUTE pg_catalog.format('ALTER TABLE %s VALIDATE CONSTRAINT %I', item.column1, item.column2);
        EXCEPTION WHEN check_violation THEN
            RAISE WARNING 'rows of % break constraint %: Redis cannot hold them, so their decisions fail until they are corrected',
                item.column1, item.column2;
        END;
    END LOOP;
END
$$;

-- History ids stay unique and increasing across a restore. pg_restore loads the policies
-- and overrides before their history; those rows come back with their own versions
-- (rl_inserted_version keeps them), and recording them again would give the restore's
-- own rows ids that the restored history then reuses. So a row inserted with its version
-- kept while the history is still empty (a restore) is not recorded: the restored
-- history already holds it. rl_inserted_version notes each such row for rl_policy_record
-- (rl_history_restored, in the backend, for the transaction); only a superuser's insert
-- can keep its version.
CREATE FUNCTION @extschema@._rl_history_restored(key text, mark boolean) RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_history_restored' LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@._rl_history_restored(text, boolean) FROM PUBLIC;
CREATE OR REPLACE FUNCTION @extschema@._rl_inserted_version(object text, name text, subject text, item jsonb)
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
        WHERE h.name = _rl_inserted_version.name AND h.new IS NOT NULL
          AND (h.new ->> 'version')::integer = supplied
          AND (h.object, h.subject, @extschema@._rl_limits(h.new))
              IS DISTINCT FROM (_rl_inserted_version.object, _rl_inserted_version.subject,
                                @extschema@._rl_limits(item)))
       OR EXISTS (SELECT FROM @extschema@.rl_override o
                  WHERE o.policy = _rl_inserted_version.name AND o.version = supplied
                    AND (object, o.subject) IS DISTINCT FROM ('override', _rl_inserted_version.subject))
       OR EXISTS (SELECT FROM @extschema@.rl_policy p
                  WHERE p.name = _rl_inserted_version.name AND p.version = supplied
                    AND object <> 'policy') THEN
        RETURN nextval('@extschema@.rl_policy_version_seq');
    END IF;
    IF supplied > (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
                   FROM @extschema@.rl_policy_version_seq) THEN
        PERFORM setval('@extschema@.rl_policy_version_seq', supplied);
    END IF;
    IF NOT EXISTS (SELECT FROM @extschema@.rl_policy_history) THEN
        PERFORM @extschema@._rl_history_restored(
            object || ':' || name || ':' || coalesce(subject, '') || ':' || supplied, true);
    END IF;
    RETURN supplied;
END
$$;

CREATE OR REPLACE FUNCTION @extschema@._rl_policy_record() RETURNS trigger
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
        RAISE EXCEPTION '_rl_policy_record is a trigger of rl_policy and rl_override only'
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
    -- A row of a restore: it comes back before its history, which records it already.
    IF TG_OP = 'INSERT' AND @extschema@._rl_history_restored(
           object || ':' || coalesce(item ->> 'name', item ->> 'policy') || ':'
           || coalesce(item ->> 'subject', '') || ':' || (item ->> 'version'), false) THEN
        RETURN NULL;
    END IF;
    INSERT INTO @extschema@.rl_policy_history (role, action, object, name, subject, old, new)
    VALUES (who, TG_OP, object, coalesce(item ->> 'name', item ->> 'policy'), item ->> 'subject',
            CASE WHEN TG_OP <> 'INSERT' THEN to_jsonb(OLD) END,
            CASE WHEN TG_OP <> 'DELETE' THEN to_jsonb(NEW) END);
    RETURN NULL;
END
$$;

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

-- Ids that earlier restores made repeat go to the rows recorded by the restore (the
-- later ones), renumbered after every other id in the order they were made; then the
-- ids are unique again, and a unique index keeps them so.
SELECT pg_catalog.setval('@extschema@.rl_policy_history_id_seq'::pg_catalog.regclass,
       GREATEST((SELECT pg_catalog.max(id) FROM @extschema@.rl_policy_history),
                (SELECT last_value FROM @extschema@.rl_policy_history_id_seq)));
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN SELECT h.ctid AS tid FROM @extschema@.rl_policy_history h
                WHERE EXISTS (SELECT FROM @extschema@.rl_policy_history o
                              WHERE o.id OPERATOR(pg_catalog.=) h.id
                                AND (o.at, o.ctid) OPERATOR(pg_catalog.<) (h.at, h.ctid))
                ORDER BY h.at, h.id LOOP
        UPDATE @extschema@.rl_policy_history
        SET id = pg_catalog.nextval('@extschema@.rl_policy_history_id_seq'::pg_catalog.regclass)
        WHERE ctid OPERATOR(pg_catalog.=) item.tid;
    END LOOP;
END
$$;
CREATE UNIQUE INDEX rl_policy_history_id_idx ON @extschema@.rl_policy_history (id);

COMMENT ON FUNCTION @extschema@.rl_reserve(text, text, bigint) IS
    'like rl_consume, but the tokens come back if the transaction or savepoint rolls back: for writes that stay in the transaction, never for reads or exports whose effect leaves it';
