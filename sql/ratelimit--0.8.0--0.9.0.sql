-- ratelimit 0.8.0 -> 0.9.0: a restore of a dump that has no installation id keeps reading
-- the keys its policies used; a policy with an allowance that can take no slices (no
-- preload) is warned of.
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.9.0'" to load this file. \quit

-- A version supplied on INSERT by a superuser (a restore) is kept; the first policy a
-- restore brings into a new installation (its id still provisional: is_called false, as
-- CREATE EXTENSION leaves it from 0.9.0 on) gives it id 0 until the dump's own id follows,
-- so that a dump of 0.3.0, which has none, keeps its keys.
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
        -- A policy made here: from now on the installation's id is its own.
        IF object = 'policy' AND NOT (SELECT is_called FROM @extschema@.rl_installation_seq) THEN
            PERFORM setval('@extschema@.rl_installation_seq',
                           (SELECT last_value FROM @extschema@.rl_installation_seq), true);
        END IF;
        RETURN nextval('@extschema@.rl_policy_version_seq');
    END IF;
    -- The first policy a restore brings into a new installation: its buckets are those of
    -- the dump's keys. A dump made since 0.4.0 sets the dumped id after the rows (pg_restore
    -- sets sequences last); a dump of 0.3.0 has none, and its keys had none: id 0, the id an
    -- installation upgraded from 0.3.0 keeps, so that a restore never starts buckets full.
    IF object = 'policy' AND NOT (SELECT is_called FROM @extschema@.rl_installation_seq)
       AND NOT EXISTS (SELECT FROM @extschema@.rl_policy) THEN
        PERFORM setval('@extschema@.rl_installation_seq', 0, false);
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

-- Sets a policy's version: a new one on insert (see _rl_inserted_version for a row that
-- brings one) and whenever algorithm, capacity, refill or time zone change; otherwise the old one,
-- whatever the statement said. Refuses an algorithm change that its 'limit' overrides
-- could not follow; warns when a 'local' policy has no local bucket to fall back on, and
-- when a policy with an allowance can take no slices.
-- SECURITY DEFINER so that policy administrators need no right on the sequence.
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
    -- ratelimit.allowance_size exists only when preloaded.
    IF NEW.allowance IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.allowance IS NULL)
       AND coalesce(current_setting('ratelimit.allowance_size', true), '0') = '0' THEN
        RAISE WARNING 'policy "%" takes no slices: every decision asks Redis', NEW.name
            USING DETAIL = 'Slices live in shared memory: ratelimit is not in shared_preload_libraries, or ratelimit.allowance_size is 0.',
                  HINT = 'Add ratelimit to shared_preload_libraries (and give ratelimit.allowance_size slots), then restart the server.';
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
