-- ratelimit 0.10.0 -> 0.11.0: one budget across regions (ratelimit.region,
-- ratelimit.regions; the policy columns region_mode, home_region, region_base).
-- Every operator and function outside a function with a pinned search_path is written
-- with pg_catalog: this script runs with the extension's schema in search_path.
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.11.0'" to load this file. \quit

ALTER TABLE @extschema@.rl_policy
    ADD COLUMN region_mode text,
    ADD COLUMN home_region text,
    ADD COLUMN region_base bigint,
    ADD CONSTRAINT rl_policy_region_mode_check
        CHECK (region_mode IS NULL
               OR region_mode OPERATOR(pg_catalog.=) ANY (ARRAY['independent', 'home', 'split'])),
    ADD CONSTRAINT rl_policy_home_region_check
        CHECK (CASE WHEN region_mode OPERATOR(pg_catalog.=) ANY (ARRAY['home', 'split'])
                    THEN home_region IS NOT NULL AND home_region OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.-]{1,63}$'
                    ELSE home_region IS NULL END),
    ADD CONSTRAINT rl_policy_region_split_check
        CHECK (region_mode IS DISTINCT FROM 'split'
               OR algorithm OPERATOR(pg_catalog.=) 'fixed_window' AND allowance IS NULL AND max_debt IS NULL),
    ADD CONSTRAINT rl_policy_region_base_check
        CHECK (region_base IS NULL
               OR region_mode IS NOT DISTINCT FROM 'split' AND region_base OPERATOR(pg_catalog.>=) 0
                  AND region_base OPERATOR(pg_catalog.<=) capacity),
    ADD CONSTRAINT rl_policy_region_home_check
        CHECK (region_mode IS DISTINCT FROM 'home' OR allowance IS NULL);
COMMENT ON CONSTRAINT rl_policy_region_mode_check ON @extschema@.rl_policy IS
    'region_mode is NULL, ''independent'', ''home'' or ''split''.';
COMMENT ON CONSTRAINT rl_policy_home_region_check ON @extschema@.rl_policy IS
    'home_region names a region (1 to 63 letters, digits, _ . -) for region_mode ''home'' and ''split'', and is NULL otherwise.';
COMMENT ON CONSTRAINT rl_policy_region_split_check ON @extschema@.rl_policy IS
    'region_mode ''split'' is for fixed_window policies without allowance or max_debt: a window''s share is exact, a refilling bucket''s is not.';
COMMENT ON CONSTRAINT rl_policy_region_base_check ON @extschema@.rl_policy IS
    'region_base is NULL or, for region_mode ''split'', a number of tokens from 0 to the capacity.';
COMMENT ON CONSTRAINT rl_policy_region_home_check ON @extschema@.rl_policy IS
    'region_mode ''home'' takes no allowance: slices are held per server, the budget in another region.';

-- A change of region_mode, home_region or region_base is a new version: the keys and
-- what a window holds mean something else.
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
           NEW.region_mode, NEW.home_region, NEW.region_base)
          IS DISTINCT FROM (OLD.algorithm, OLD.capacity, OLD.refill_amount, OLD.refill_period, OLD.time_zone,
                            OLD.region_mode, OLD.home_region, OLD.region_base) THEN
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

-- rl_define returns the row: made again, so that the row it returns has the new columns
-- (a SQL-standard body is bound when created).
CREATE OR REPLACE FUNCTION @extschema@.rl_define(name text, amount bigint, per interval,
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
