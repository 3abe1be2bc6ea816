-- ratelimit 0.8.0 -> 0.9.0: a restore of a dump that has no installation id keeps reading
-- the keys its policies used; a policy with an allowance that can take no slices (no
-- preload) is warned of; a row that breaks a CHECK constraint is told what it requires.
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

-- What each CHECK constraint of the two tables requires, in words: the HINT of its error
-- (_rl_explain_check).
COMMENT ON CONSTRAINT rl_policy_name_check ON @extschema@.rl_policy IS
    'A policy name is 1 to 63 characters of a-z, 0-9, "_", "." and "-", as in ''reports.export''.';
COMMENT ON CONSTRAINT rl_policy_algorithm_check ON @extschema@.rl_policy IS
    'algorithm is one of token_bucket, gcra, fixed_window, sliding_window, sliding_log or concurrency.';
COMMENT ON CONSTRAINT rl_policy_algorithm_fields_check ON @extschema@.rl_policy IS
    'token_bucket and gcra need refill_amount and refill_period; the window algorithms need refill_period (the window) and take no refill_amount nor idle_ttl; concurrency takes no refill and needs idle_ttl (how long a lease lives).';
COMMENT ON CONSTRAINT rl_policy_capacity_check ON @extschema@.rl_policy IS
    'capacity is at least 1.';
COMMENT ON CONSTRAINT rl_policy_capacity_bound_check ON @extschema@.rl_policy IS
    'capacity is below 2^53 (9,007,199,254,740,992), which Redis''s numbers hold exactly.';
COMMENT ON CONSTRAINT rl_policy_refill_amount_check ON @extschema@.rl_policy IS
    'refill_amount is at least 1.';
COMMENT ON CONSTRAINT rl_policy_refill_period_check ON @extschema@.rl_policy IS
    'refill_period is a whole number of milliseconds, at least 1 ms, without months or years; or exactly ''1 mon'' or ''1 year'' (fixed_window).';
COMMENT ON CONSTRAINT rl_policy_months_check ON @extschema@.rl_policy IS
    'Only fixed_window takes a period of a month or a year.';
COMMENT ON CONSTRAINT rl_policy_time_zone_check ON @extschema@.rl_policy IS
    'time_zone is a zone PostgreSQL knows (SELECT name FROM pg_timezone_names), at most 63 bytes.';
COMMENT ON CONSTRAINT rl_policy_time_zone_algorithm_check ON @extschema@.rl_policy IS
    'Only fixed_window takes a time_zone other than UTC (its calendar windows start at local midnight).';
COMMENT ON CONSTRAINT rl_policy_window_bound_check ON @extschema@.rl_policy IS
    'gcra: refill_amount / g at most 512 and capacity * period_ms / g below 2^52 (g: their gcd); sliding_window: capacity * period_ms below 2^51; sliding_log: capacity at most 10,000.';
COMMENT ON CONSTRAINT rl_policy_allowance_check ON @extschema@.rl_policy IS
    'allowance is NULL (none) or from 1 to the capacity.';
COMMENT ON CONSTRAINT rl_policy_allowance_ttl_check ON @extschema@.rl_policy IS
    'allowance_ttl is a whole number of milliseconds from 1 ms to 1 hour.';
COMMENT ON CONSTRAINT rl_policy_allowance_algorithm_check ON @extschema@.rl_policy IS
    'Only token_bucket, gcra and fixed_window take an allowance.';
COMMENT ON CONSTRAINT rl_policy_idle_ttl_check ON @extschema@.rl_policy IS
    'idle_ttl is NULL or a whole number of milliseconds, at least the time the bucket takes to refill completely (capacity / refill_amount * refill_period).';
COMMENT ON CONSTRAINT rl_policy_idle_ttl_bound_check ON @extschema@.rl_policy IS
    'idle_ttl is at most 2^52 ms (about 142,000 years).';
COMMENT ON CONSTRAINT rl_policy_fail_mode_check ON @extschema@.rl_policy IS
    'fail_mode is open, closed or local.';
COMMENT ON CONSTRAINT rl_policy_mode_check ON @extschema@.rl_policy IS
    'mode is enforce, shadow or disabled.';
COMMENT ON CONSTRAINT rl_policy_local_share_check ON @extschema@.rl_policy IS
    'local_share is from 0.000001 to 1.';
COMMENT ON CONSTRAINT rl_policy_exact_check ON @extschema@.rl_policy IS
    'capacity * period_ms / g + refill_amount / g is below 2^53 (g: the gcd of refill_amount and period_ms): a smaller capacity, or a refill that divides the period.';
COMMENT ON CONSTRAINT rl_override_subject_check ON @extschema@.rl_override IS
    'subject is 1 to 1024 bytes.';
COMMENT ON CONSTRAINT rl_override_action_check ON @extschema@.rl_override IS
    'action is limit, allow or deny.';
COMMENT ON CONSTRAINT rl_override_action_fields_check ON @extschema@.rl_override IS
    'allow and deny take no limits; limit needs a capacity; a refill_amount needs a refill_period.';
COMMENT ON CONSTRAINT rl_override_capacity_check ON @extschema@.rl_override IS
    'capacity is at least 1.';
COMMENT ON CONSTRAINT rl_override_capacity_bound_check ON @extschema@.rl_override IS
    'capacity is below 2^53 (9,007,199,254,740,992).';
COMMENT ON CONSTRAINT rl_override_refill_amount_check ON @extschema@.rl_override IS
    'refill_amount is at least 1.';
COMMENT ON CONSTRAINT rl_override_refill_period_check ON @extschema@.rl_override IS
    'refill_period is a whole number of milliseconds, at least 1 ms, without months or years.';
COMMENT ON CONSTRAINT rl_override_expiry_check ON @extschema@.rl_override IS
    'expires_at is NULL or later than created_at.';
COMMENT ON CONSTRAINT rl_override_exact_check ON @extschema@.rl_override IS
    'capacity * period_ms / g + refill_amount / g is below 2^53 (g: the gcd of refill_amount and period_ms).';

-- Says in words what a new row of rl_policy or rl_override breaks: the first of its CHECK
-- constraints (by name, as PostgreSQL checks them) that it fails raises 23514 with that
-- constraint's name, as PostgreSQL would, and what the constraint requires (its comment)
-- as the HINT. The constraints stay the rule (a row this misses is still refused); this
-- only explains, before they would: it raises no DETAIL (an override's row holds its raw
-- subject, which no log line shows). Rows of these tables are written rarely. Its triggers
-- fire after the tables' other BEFORE triggers (they fire by name), whose errors come first,
-- and before a trigger of yours named after them.
CREATE FUNCTION @extschema@._rl_explain_check() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    tests text;
    failed name;
BEGIN
    SELECT string_agg(format('WHEN (%s) IS FALSE THEN %L', pg_get_expr(c.conbin, c.conrelid), c.conname),
                      ' ' ORDER BY c.conname)
      INTO tests FROM pg_constraint c WHERE c.conrelid OPERATOR(pg_catalog.=) TG_RELID AND c.contype OPERATOR(pg_catalog.=) 'c';
    -- A NULL where the table wants none is PostgreSQL's to refuse first (23502), as before.
    IF tests IS NOT NULL AND NOT EXISTS (
        SELECT FROM pg_attribute a
         WHERE a.attrelid OPERATOR(pg_catalog.=) TG_RELID AND a.attnum OPERATOR(pg_catalog.>) 0
           AND NOT a.attisdropped AND a.attnotnull
           AND jsonb_typeof(to_jsonb(NEW) OPERATOR(pg_catalog.->) a.attname::text) OPERATOR(pg_catalog.=) 'null') THEN
        EXECUTE format('SELECT CASE %s END FROM (SELECT ($1).*) AS r', tests) INTO failed USING NEW;
    END IF;
    IF failed IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', TG_TABLE_NAME, failed
            USING ERRCODE = 'check_violation', CONSTRAINT = failed, TABLE = TG_TABLE_NAME,
                  SCHEMA = TG_TABLE_SCHEMA,
                  HINT = coalesce((SELECT obj_description(c.oid, 'pg_constraint') FROM pg_constraint c
                                   WHERE c.conrelid OPERATOR(pg_catalog.=) TG_RELID AND c.conname OPERATOR(pg_catalog.=) failed),
                                  'See the constraints of ' || TG_TABLE_NAME || ' in the manual.');
    END IF;
    RETURN NEW;
END
$$;

REVOKE ALL ON FUNCTION @extschema@._rl_explain_check() FROM PUBLIC;

CREATE TRIGGER rl_policy_words
    BEFORE INSERT OR UPDATE ON @extschema@.rl_policy
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_explain_check();
CREATE TRIGGER rl_override_words
    BEFORE INSERT OR UPDATE ON @extschema@.rl_override
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_explain_check();
