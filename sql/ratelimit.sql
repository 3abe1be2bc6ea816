-- ratelimit: policies as rows of PostgreSQL, decisions from buckets in Redis.
--
-- The full install script of the current version: the build copies this file to
-- sql/ratelimit--<default_version>.sql. Edit it here. An installation made with an older
-- version reaches the same objects through the update scripts sql/ratelimit--A--B.sql
-- (sql/upgrade.sql compares the two), so every change here needs one there too.
--
-- The public API is named rl_*; functions only the extension's own tables, constraints and
-- views call are named _rl_* and are not part of it. Expressions that are parsed now (the
-- constraints, SQL-standard bodies) name PostgreSQL's operators and functions with
-- pg_catalog: this script runs with the extension's schema in search_path, where another
-- role may have put look-alikes. Functions in PL/pgSQL pin their own search_path.
\echo Use "CREATE EXTENSION ratelimit" to load this file. \quit

--
-- The arithmetic of the table constraints (executable by everyone: constraints call them).
--

-- Milliseconds in an interval without a month part (months have no fixed length).
-- A SQL-standard body is bound when created, so search_path cannot redirect it.
CREATE FUNCTION @extschema@._rl_interval_ms(period interval) RETURNS numeric
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN EXTRACT(epoch FROM period) OPERATOR(pg_catalog.*) 1000;

-- True when an interval is a whole, positive number of milliseconds with no month part.
CREATE FUNCTION @extschema@._rl_interval_is_whole_ms(period interval) RETURNS boolean
IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN EXTRACT(month FROM period) OPERATOR(pg_catalog.=) 0
   AND EXTRACT(year FROM period) OPERATOR(pg_catalog.=) 0
   AND @extschema@._rl_interval_ms(period) OPERATOR(pg_catalog.>=) 1
   AND @extschema@._rl_interval_ms(period)
       OPERATOR(pg_catalog.=) pg_catalog.trunc(@extschema@._rl_interval_ms(period));

-- True when the bucket's integer arithmetic stays exact in Redis's Lua (doubles):
-- with g = gcd(refill_amount, period_ms), capacity * period_ms / g + refill_amount / g
-- must stay below 2^53. src/algorithm/token_bucket.c checks the same bound.
CREATE FUNCTION @extschema@._rl_bucket_is_exact(capacity bigint, refill_amount bigint, refill_period interval)
RETURNS boolean IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN CASE WHEN refill_amount OPERATOR(pg_catalog.>) 0
                 AND @extschema@._rl_interval_ms(refill_period) OPERATOR(pg_catalog.>=) 1 THEN
    -- (OPERATOR() binds left to right, whatever the operator: hence the parentheses.)
    ((capacity::numeric OPERATOR(pg_catalog.*)
      (@extschema@._rl_interval_ms(refill_period) OPERATOR(pg_catalog./)
       pg_catalog.gcd(refill_amount::numeric, @extschema@._rl_interval_ms(refill_period))))
     OPERATOR(pg_catalog.+)
     (refill_amount OPERATOR(pg_catalog./)
      pg_catalog.gcd(refill_amount::numeric, @extschema@._rl_interval_ms(refill_period))))
    OPERATOR(pg_catalog.<) (2::numeric OPERATOR(pg_catalog.^) 53) END;

-- Milliseconds an empty bucket needs to refill completely, rounded up.
-- (Both functions leave non-positive input to the table's own checks: NULL passes.)
CREATE FUNCTION @extschema@._rl_refill_ms(capacity bigint, refill_amount bigint, refill_period interval)
RETURNS numeric IMMUTABLE STRICT PARALLEL SAFE LANGUAGE sql
RETURN CASE WHEN refill_amount OPERATOR(pg_catalog.>) 0 THEN
    pg_catalog.ceil((capacity::numeric OPERATOR(pg_catalog.*) @extschema@._rl_interval_ms(refill_period))
                    OPERATOR(pg_catalog./) refill_amount) END;

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

--
-- Policies: one row per limit.
--

-- Versions come from one sequence, so a version is never reused, not even by a policy
-- that is dropped and created again.
CREATE SEQUENCE @extschema@.rl_policy_version_seq AS integer;
REVOKE ALL ON SEQUENCE @extschema@.rl_policy_version_seq FROM PUBLIC;

-- Versions start again at 1 when the extension is dropped and created again, so every
-- key also names the installation: a random id chosen now, kept by pg_dump (a restored
-- database reads the same buckets). The sequence is only a dumpable place for one number:
-- nothing calls nextval on it. Its is_called is false until the first policy is made
-- here: until then a restore may still bring the keys of its dump (_rl_inserted_version).
CREATE SEQUENCE @extschema@.rl_installation_seq AS bigint MINVALUE 0 START 0;
SELECT pg_catalog.setval('@extschema@.rl_installation_seq',
       GREATEST(1, ('x' OPERATOR(pg_catalog.||)
                    pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::text), 1, 12))::bit(48)::bigint),
       false);
REVOKE ALL ON SEQUENCE @extschema@.rl_installation_seq FROM PUBLIC;
COMMENT ON SEQUENCE @extschema@.rl_installation_seq IS
    'the id of this installation of the extension, part of every Redis key; never advanced';

-- A token bucket refills; a concurrency policy holds leases, each living at most idle_ttl
-- (the backstop for a holder that dies), and has no refill. The bounds are what the
-- scripts hold exactly (Lua numbers are doubles): a capacity below 2^53, an idle_ttl of at
-- most 2^52 ms (about 142,000 years, so that now + TTL stays exact).
CREATE TABLE @extschema@.rl_policy (
    name          text PRIMARY KEY
                  CONSTRAINT rl_policy_name_check CHECK (name OPERATOR(pg_catalog.~) '^[a-z0-9_.-]{1,63}$'),
    algorithm     text NOT NULL DEFAULT 'token_bucket'
                  CONSTRAINT rl_policy_algorithm_check
                  CHECK (algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window',
                                                                     'sliding_window', 'sliding_log',
                                                                     'concurrency'])),
    capacity      bigint NOT NULL
                  CONSTRAINT rl_policy_capacity_check CHECK (capacity OPERATOR(pg_catalog.>) 0),
    refill_amount bigint
                  CONSTRAINT rl_policy_refill_amount_check CHECK (refill_amount OPERATOR(pg_catalog.>) 0),
    refill_period interval
                  CONSTRAINT rl_policy_refill_period_check
                  CHECK (@extschema@._rl_interval_is_whole_ms(refill_period)
                         OR @extschema@._rl_interval_is_calendar_months(refill_period)),
    idle_ttl      interval,
    fail_mode     text NOT NULL DEFAULT 'closed'
                  CONSTRAINT rl_policy_fail_mode_check
                  CHECK (fail_mode OPERATOR(pg_catalog.=) ANY (ARRAY['open', 'closed', 'local'])),
    mode          text NOT NULL DEFAULT 'enforce'
                  CONSTRAINT rl_policy_mode_check
                  CHECK (mode OPERATOR(pg_catalog.=) ANY (ARRAY['enforce', 'shadow', 'disabled'])),
    local_share   numeric NOT NULL DEFAULT 1
                  CONSTRAINT rl_policy_local_share_check
                  CHECK (local_share OPERATOR(pg_catalog.>=) 0.000001 AND local_share OPERATOR(pg_catalog.<=) 1),
    version       integer NOT NULL DEFAULT 0,
    CONSTRAINT rl_policy_algorithm_fields_check
        CHECK (CASE
                   WHEN algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra'])
                       THEN refill_amount IS NOT NULL AND refill_period IS NOT NULL
                   WHEN algorithm OPERATOR(pg_catalog.=) 'concurrency'
                       THEN refill_amount IS NULL AND refill_period IS NULL AND idle_ttl IS NOT NULL
                   ELSE refill_amount IS NULL AND refill_period IS NOT NULL AND idle_ttl IS NULL
               END),
    CONSTRAINT rl_policy_idle_ttl_check
        CHECK (idle_ttl IS NULL
               OR @extschema@._rl_interval_is_whole_ms(idle_ttl) AND @extschema@._rl_interval_ms(idle_ttl)
                   OPERATOR(pg_catalog.>=) @extschema@._rl_refill_ms(capacity, refill_amount, refill_period)),
    CONSTRAINT rl_policy_exact_check
        CHECK (@extschema@._rl_bucket_is_exact(capacity, refill_amount, refill_period)),
    CONSTRAINT rl_policy_capacity_bound_check
        CHECK (capacity OPERATOR(pg_catalog.<) 9007199254740992::bigint),
    CONSTRAINT rl_policy_idle_ttl_bound_check
        CHECK (idle_ttl IS NULL OR @extschema@._rl_interval_ms(idle_ttl)
               OPERATOR(pg_catalog.<=) 4503599627370496::numeric),
    time_zone     text NOT NULL DEFAULT 'UTC'
                  CONSTRAINT rl_policy_time_zone_check
                  CHECK (@extschema@._rl_time_zone_is_valid(time_zone)),
    -- A denial from Redis is remembered on this server until its retry-after.
    deny_cache    boolean NOT NULL DEFAULT true,
    -- A hot subject's takes granted from this server's slice of at most allowance of its
    -- tokens, each slice used for at most allowance_ttl (NULL: every take asks Redis).
    allowance     bigint,
    allowance_ttl interval NOT NULL DEFAULT '1 second',
    CONSTRAINT rl_policy_allowance_check
        CHECK (allowance IS NULL
               OR allowance OPERATOR(pg_catalog.>=) 1 AND allowance OPERATOR(pg_catalog.<=) capacity),
    CONSTRAINT rl_policy_allowance_ttl_check
        CHECK (@extschema@._rl_interval_is_whole_ms(allowance_ttl)
               AND @extschema@._rl_interval_ms(allowance_ttl) OPERATOR(pg_catalog.<=) 3600000),
    CONSTRAINT rl_policy_allowance_algorithm_check
        CHECK (allowance IS NULL
               OR algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])),
    CONSTRAINT rl_policy_months_check
        CHECK (algorithm OPERATOR(pg_catalog.=) 'fixed_window'
               OR NOT @extschema@._rl_interval_is_calendar_months(refill_period)),
    CONSTRAINT rl_policy_time_zone_algorithm_check
        CHECK (algorithm OPERATOR(pg_catalog.=) 'fixed_window' OR time_zone OPERATOR(pg_catalog.=) 'UTC'),
    CONSTRAINT rl_policy_window_bound_check
        CHECK (@extschema@._rl_window_is_exact(algorithm, capacity, refill_amount, refill_period)),
    -- The most tokens a subject may owe past empty: waits booked ahead of their time
    -- (max_wait) and costs settled beyond what it held (rl_settle); NULL: its capacity.
    max_debt      bigint,
    -- How long a grant asked with a request_id is remembered: the same request again within
    -- it gets the same grant and takes nothing.
    replay_window interval NOT NULL DEFAULT '1 hour',
    CONSTRAINT rl_policy_max_debt_check
        CHECK (max_debt IS NULL
               OR max_debt OPERATOR(pg_catalog.>=) 0
                  AND algorithm OPERATOR(pg_catalog.=) ANY (ARRAY['token_bucket', 'gcra', 'fixed_window'])
                  AND max_debt OPERATOR(pg_catalog.<) (9007199254740992::bigint OPERATOR(pg_catalog.-) capacity)
                  AND (refill_amount IS NULL
                       OR @extschema@._rl_bucket_is_exact(capacity OPERATOR(pg_catalog.+) max_debt,
                                                          refill_amount, refill_period))),
    CONSTRAINT rl_policy_replay_window_check
        CHECK (@extschema@._rl_interval_is_whole_ms(replay_window)
               AND @extschema@._rl_interval_ms(replay_window) OPERATOR(pg_catalog.>=) 1
               AND @extschema@._rl_interval_ms(replay_window) OPERATOR(pg_catalog.<=) 604800000),
    -- How the budget spans regions (ratelimit.region, ratelimit.regions): NULL, every decision
    -- in this server's Redis; 'independent', the same, each region deciding alone (up to the
    -- number of regions times the policy); 'home', every decision in home_region's Redis;
    -- 'split', each region deciding from its share of each window, region_base tokens
    -- (NULL: capacity / (2 x regions)), and from leases of home_region's rest.
    region_mode   text,
    home_region   text,
    region_base   bigint,
    CONSTRAINT rl_policy_region_mode_check
        CHECK (region_mode IS NULL
               OR region_mode OPERATOR(pg_catalog.=) ANY (ARRAY['independent', 'home', 'split'])),
    CONSTRAINT rl_policy_home_region_check
        CHECK (CASE WHEN region_mode OPERATOR(pg_catalog.=) ANY (ARRAY['home', 'split'])
                    THEN home_region IS NOT NULL AND home_region OPERATOR(pg_catalog.~) '^[A-Za-z0-9_.-]{1,63}$'
                    ELSE home_region IS NULL END),
    CONSTRAINT rl_policy_region_split_check
        CHECK (region_mode IS DISTINCT FROM 'split'
               OR algorithm OPERATOR(pg_catalog.=) 'fixed_window' AND allowance IS NULL AND max_debt IS NULL),
    CONSTRAINT rl_policy_region_base_check
        CHECK (region_base IS NULL
               OR region_mode IS NOT DISTINCT FROM 'split' AND region_base OPERATOR(pg_catalog.>=) 0
                  AND region_base OPERATOR(pg_catalog.<=) capacity),
    CONSTRAINT rl_policy_region_home_check
        CHECK (region_mode IS DISTINCT FROM 'home' OR allowance IS NULL),
    -- A fixed window's rollover: what the previous window left unused, at most this many
    -- tokens, is added to the window's limit (NULL: none).
    rollover      bigint,
    CONSTRAINT rl_policy_rollover_check
        CHECK (rollover IS NULL
               OR algorithm OPERATOR(pg_catalog.=) 'fixed_window' AND region_mode IS DISTINCT FROM 'split'
                  AND rollover OPERATOR(pg_catalog.>=) 0 AND rollover OPERATOR(pg_catalog.<=) capacity
                  AND rollover OPERATOR(pg_catalog.<) (9007199254740992::bigint OPERATOR(pg_catalog.-) capacity))
);
REVOKE ALL ON @extschema@.rl_policy FROM PUBLIC;
COMMENT ON TABLE @extschema@.rl_policy IS 'rate limit policies: one row per limit';
COMMENT ON COLUMN @extschema@.rl_policy.version IS
    'bumped by the extension when a change alters the meaning of stored bucket state';

-- True when local fallback buckets exist (ratelimit is in shared_preload_libraries).
CREATE FUNCTION @extschema@._rl_local_available() RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_local_available' LANGUAGE C STABLE PARALLEL SAFE;
REVOKE ALL ON FUNCTION @extschema@._rl_local_available() FROM PUBLIC;

--
-- Overrides: other limits for one subject of a policy.
--

-- A premium tenant gets more, a noisy one less ('limit'), or a subject is always allowed
-- ('allow') or always denied ('deny'), until expires_at. A 'limit' override has its own
-- version, so its bucket has its own Redis key.
CREATE TABLE @extschema@.rl_override (
    policy        text NOT NULL
                  REFERENCES @extschema@.rl_policy (name) ON UPDATE CASCADE ON DELETE CASCADE,
    subject       text NOT NULL
                  CONSTRAINT rl_override_subject_check
                  CHECK (pg_catalog.octet_length(subject) OPERATOR(pg_catalog.>=) 1
                         AND pg_catalog.octet_length(subject) OPERATOR(pg_catalog.<=) 1024),
    action        text NOT NULL DEFAULT 'limit'
                  CONSTRAINT rl_override_action_check
                  CHECK (action OPERATOR(pg_catalog.=) ANY (ARRAY['limit', 'allow', 'deny'])),
    capacity      bigint
                  CONSTRAINT rl_override_capacity_check CHECK (capacity OPERATOR(pg_catalog.>) 0),
    refill_amount bigint
                  CONSTRAINT rl_override_refill_amount_check CHECK (refill_amount OPERATOR(pg_catalog.>) 0),
    refill_period interval
                  CONSTRAINT rl_override_refill_period_check
                  CHECK (@extschema@._rl_interval_is_whole_ms(refill_period)),
    expires_at    timestamptz,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    version       integer NOT NULL DEFAULT 0,
    PRIMARY KEY (policy, subject),
    -- 'limit' sets a capacity (and, for a token bucket, a refill); 'allow' and 'deny' set none.
    CONSTRAINT rl_override_action_fields_check
        CHECK (CASE action
                   WHEN 'limit' THEN capacity IS NOT NULL
                                     AND (refill_amount IS NULL) OPERATOR(pg_catalog.=) (refill_period IS NULL)
                   ELSE capacity IS NULL AND refill_amount IS NULL AND refill_period IS NULL
               END),
    -- Compared with created_at, not now(): a dumped override that has expired since
    -- still restores, while a new one cannot be born expired.
    CONSTRAINT rl_override_expiry_check
        CHECK (expires_at IS NULL OR expires_at OPERATOR(pg_catalog.>) created_at),
    CONSTRAINT rl_override_exact_check
        CHECK (@extschema@._rl_bucket_is_exact(capacity, refill_amount, refill_period)),
    CONSTRAINT rl_override_capacity_bound_check
        CHECK (capacity OPERATOR(pg_catalog.<) 9007199254740992::bigint)
);
REVOKE ALL ON @extschema@.rl_override FROM PUBLIC;
COMMENT ON TABLE @extschema@.rl_override IS
    'per-subject limits of a policy: another limit, always allow or always deny, until expires_at';

--
-- History: every change of a policy or an override, written by the extension only.
--

-- No primary key: pg_restore loads the dumped rows (with their ids) after the restore's own
-- inserts into rl_policy. Rows a restore brings back are not recorded again
-- (_rl_history_restored), so the ids stay unique; read the trail ordered by (at, id).
-- (subject comes last: an installation updated from 0.1.0 added it last.)
CREATE SEQUENCE @extschema@.rl_policy_history_id_seq;
REVOKE ALL ON SEQUENCE @extschema@.rl_policy_history_id_seq FROM PUBLIC;
CREATE TABLE @extschema@.rl_policy_history (
    id        bigint NOT NULL
              DEFAULT pg_catalog.nextval('@extschema@.rl_policy_history_id_seq'::pg_catalog.regclass),
    at        timestamptz NOT NULL DEFAULT pg_catalog.now(),
    role      text NOT NULL,
    xid       xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    action    text NOT NULL
              CONSTRAINT rl_policy_history_action_check
              CHECK (action OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'])),
    object    text NOT NULL DEFAULT 'policy',
    name      text NOT NULL,
    old       jsonb,
    new       jsonb,
    subject   text,
    CONSTRAINT rl_policy_history_object_check
        CHECK (object OPERATOR(pg_catalog.=) ANY (ARRAY['policy', 'override']))
);
ALTER SEQUENCE @extschema@.rl_policy_history_id_seq OWNED BY @extschema@.rl_policy_history.id;
CREATE INDEX rl_policy_history_name_idx ON @extschema@.rl_policy_history (name, id);
CREATE UNIQUE INDEX rl_policy_history_id_idx ON @extschema@.rl_policy_history (id);
REVOKE ALL ON @extschema@.rl_policy_history FROM PUBLIC;
COMMENT ON TABLE @extschema@.rl_policy_history IS
    'every change of a policy or override: written by the extension';

-- The part of a policy or override row (as jsonb) that gives meaning to its bucket state.
CREATE FUNCTION @extschema@._rl_limits(item jsonb) RETURNS jsonb
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
REVOKE ALL ON FUNCTION @extschema@._rl_limits(jsonb) FROM PUBLIC;

-- With mark, notes (in the backend, for the transaction) that the row with key was
-- inserted by a restore and returns true; without, returns whether that row was noted,
-- and forgets it. Such a row is not recorded again: the restored history holds it.
CREATE FUNCTION @extschema@._rl_history_restored(key text, mark boolean) RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_history_restored' LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@._rl_history_restored(text, boolean) FROM PUBLIC;

-- The version an inserted row gets. A row that a superuser inserts with one (pg_restore
-- does) keeps it when no row ever recorded with that name and version had other limits, so
-- the restored policy finds its own buckets and nothing can misread another's; otherwise,
-- and for everyone else, a new version. A version kept moves the sequence past it, so none
-- is issued twice. A row inserted with its version kept while the history is still empty
-- (a restore, which loads policies and overrides before their history) is noted for
-- _rl_policy_record.
CREATE FUNCTION @extschema@._rl_inserted_version(object text, name text, subject text, item jsonb)
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
REVOKE ALL ON FUNCTION @extschema@._rl_inserted_version(text, text, text, jsonb) FROM PUBLIC;

-- Records one change of a policy or an override, with the old and new rows, the role that
-- made it (SET ROLE, else the session's), the time and the transaction. SECURITY DEFINER:
-- no role needs (or gets) a right on the history.
CREATE FUNCTION @extschema@._rl_policy_record() RETURNS trigger
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
REVOKE ALL ON FUNCTION @extschema@._rl_policy_record() FROM PUBLIC;

--
-- The triggers of the tables: versions, cache invalidation, history.
--

-- Sets a policy's version: a new one on insert (see _rl_inserted_version for a row that
-- brings one) and whenever algorithm, capacity, refill, time zone or regions change; otherwise the old one,
-- whatever the statement said. Refuses an algorithm change that its 'limit' overrides
-- could not follow; warns when a 'local' policy has no local bucket to fall back on, and
-- when a policy with an allowance can take no slices.
-- SECURITY DEFINER so that policy administrators need no right on the sequence.
CREATE FUNCTION @extschema@._rl_policy_set_version() RETURNS trigger
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
REVOKE ALL ON FUNCTION @extschema@._rl_policy_set_version() FROM PUBLIC;

-- Checks an override against its policy's algorithm and sets its version: a new one on
-- insert and whenever action, capacity or refill change, otherwise the old one.
CREATE FUNCTION @extschema@._rl_override_set_version() RETURNS trigger
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
REVOKE ALL ON FUNCTION @extschema@._rl_override_set_version() FROM PUBLIC;

-- Tells every backend to drop its cached policies when the transaction commits.
CREATE FUNCTION @extschema@._rl_policy_invalidate() RETURNS trigger
AS 'MODULE_PATHNAME', 'rl_policy_invalidate' LANGUAGE C;
-- Nobody may attach the trigger functions to a table of their own.
REVOKE ALL ON FUNCTION @extschema@._rl_policy_invalidate() FROM PUBLIC;

CREATE TRIGGER rl_policy_set_version
    BEFORE INSERT OR UPDATE ON @extschema@.rl_policy
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_policy_set_version();
CREATE TRIGGER rl_policy_invalidate
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.rl_policy
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._rl_policy_invalidate();
CREATE TRIGGER rl_policy_record
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.rl_policy
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_policy_record();
CREATE TRIGGER rl_policy_record_truncate
    BEFORE TRUNCATE ON @extschema@.rl_policy
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._rl_policy_record();

CREATE TRIGGER rl_override_set_version
    BEFORE INSERT OR UPDATE ON @extschema@.rl_override
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_override_set_version();
CREATE TRIGGER rl_override_invalidate
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON @extschema@.rl_override
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._rl_policy_invalidate();
CREATE TRIGGER rl_override_record
    AFTER INSERT OR UPDATE OR DELETE ON @extschema@.rl_override
    FOR EACH ROW EXECUTE FUNCTION @extschema@._rl_policy_record();
CREATE TRIGGER rl_override_record_truncate
    BEFORE TRUNCATE ON @extschema@.rl_override
    FOR EACH STATEMENT EXECUTE FUNCTION @extschema@._rl_policy_record();

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
COMMENT ON CONSTRAINT rl_policy_max_debt_check ON @extschema@.rl_policy IS
    'max_debt is NULL (the capacity) or a whole number of tokens from 0, only for token_bucket, gcra and fixed_window, with capacity + max_debt exact (as capacity must be).';
COMMENT ON CONSTRAINT rl_policy_replay_window_check ON @extschema@.rl_policy IS
    'replay_window is a whole number of milliseconds from 1 ms to 7 days.';
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
COMMENT ON CONSTRAINT rl_policy_rollover_check ON @extschema@.rl_policy IS
    'rollover is NULL (none) or, for fixed_window policies not split across regions, a number of tokens from 0 to the capacity, with capacity + rollover below 2^53.';
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

-- pg_dump keeps the user's policies, overrides, history and the counters.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_version_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_history', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_policy_history_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_override', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.rl_installation_seq', '');

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

--
-- Decisions. Spending budget is a privilege: the owner grants each function to the roles
-- that need it.
--

CREATE TYPE @extschema@.rl_decision AS (
    allowed        boolean,
    remaining      bigint,
    capacity       bigint,
    retry_after_ms bigint,
    reset_after_ms bigint,
    policy         text,
    version        integer,
    source         text,
    waited_ms      bigint
);

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

CREATE FUNCTION @extschema@.rl_peek(policy text, subject text, cost bigint DEFAULT 1)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_peek' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_peek(text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_peek(text, text, bigint) IS
    'the decision rl_consume would make, taking nothing';

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

CREATE FUNCTION @extschema@.rl_refund(policy text, subject text, amount bigint)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_refund' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_refund(text, text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_refund(text, text, bigint) IS
    'give tokens back to the subject''s bucket, never above capacity';

CREATE FUNCTION @extschema@.rl_reset(policy text, subject text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_reset' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_reset(text, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_reset(text, text) IS
    'make the subject''s bucket full again; false when Redis could not answer';

CREATE FUNCTION @extschema@.rl_consume_all(policies text[], subjects text[], costs bigint[] DEFAULT NULL,
                                          request_id text DEFAULT NULL)
RETURNS SETOF @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_consume_all' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 2;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[], text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume_all(text[], text[], bigint[], text) IS
    'several checks in one atomic step: all granted or none charged (once per request_id); subjects share a hash tag';

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
    source         text,
    waited_ms      bigint
);
CREATE FUNCTION @extschema@.rl_consume_many(policy text, subjects text[], costs bigint[] DEFAULT NULL,
                                           request_ids text[] DEFAULT NULL)
RETURNS SETOF @extschema@.rl_subject_decision
AS 'MODULE_PATHNAME', 'rl_consume_many' LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
REVOKE ALL ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[], text[]) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_consume_many(text, text[], bigint[], text[]) IS
    'a decision per subject of one policy, in one round trip per Redis node; NULL costs mean 1 each; request_ids make each once per id';

CREATE FUNCTION @extschema@.rl_limit_trigger() RETURNS trigger
AS 'MODULE_PATHNAME', 'rl_limit_trigger' LANGUAGE C;
REVOKE ALL ON FUNCTION @extschema@.rl_limit_trigger() FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_limit_trigger() IS
    'trigger: charge a policy per row written (or once per subject for a statement), raise when denied';

--
-- Leases of concurrency policies.
--

CREATE FUNCTION @extschema@.rl_acquire(policy text, subject text, scope text DEFAULT 'transaction',
                                      max_wait interval DEFAULT NULL)
RETURNS @extschema@.rl_decision
AS 'MODULE_PATHNAME', 'rl_acquire' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_acquire(text, text, text, interval) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_acquire(text, text, text, interval) IS
    'take one lease of a concurrency policy (waiting up to max_wait for one), released when the transaction (or session) ends';

CREATE FUNCTION @extschema@.rl_release(policy text, subject text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'rl_release' LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_release(text, text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_release(text, text) IS
    'give back the latest lease this session holds for the policy and subject';

--
-- HTTP.
--

-- RateLimit-Policy and RateLimit (IETF draft revision 10), Retry-After when denied; legacy
-- => true gives RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset instead of the two
-- structured fields. PARALLEL UNSAFE: it may load the policy cache, which needs the latest
-- snapshot.
CREATE FUNCTION @extschema@.rl_headers(decision @extschema@.rl_decision, legacy boolean DEFAULT false)
RETURNS jsonb
AS 'MODULE_PATHNAME', 'rl_headers' LANGUAGE C STABLE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_headers(@extschema@.rl_decision, boolean) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_headers(@extschema@.rl_decision, boolean) IS
    'the HTTP response headers (name => string value) that tell a client about a decision';

-- For PostgREST: adds the decision's headers to response.headers (kept for this
-- transaction) and returns the decision.
CREATE FUNCTION @extschema@.rl_response_headers(decision @extschema@.rl_decision, legacy boolean DEFAULT false)
RETURNS @extschema@.rl_decision
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current jsonb := coalesce(nullif(current_setting('response.headers', true), ''), '[]')::jsonb;
BEGIN
    PERFORM set_config('response.headers',
                       (current || coalesce((SELECT jsonb_agg(jsonb_build_object(key, value))
                                             FROM jsonb_each(@extschema@.rl_headers(decision, legacy))),
                                            '[]'))::text,
                       true);
    RETURN decision;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.rl_response_headers(@extschema@.rl_decision, boolean) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_response_headers(@extschema@.rl_decision, boolean) IS
    'PostgREST: add the decision''s headers to response.headers, return the decision';

--
-- Watching the limiter: health and counters hold no subject; pg_monitor may read them.
--

-- A row per Redis node with a breaker (one, unless Redis is a cluster: then each master):
-- reachable or not (since when), the breaker, the local buckets, the last error (what and
-- when), the node, the slots it owns. Without shared_preload_libraries it is this
-- session's own view (shared = false).
CREATE FUNCTION @extschema@.rl_health(
    OUT redis_reachable boolean,
    OUT since timestamptz,
    OUT breaker text,
    OUT retry_in_ms bigint,
    OUT last_error text,
    OUT local_buckets_in_use integer,
    OUT local_buckets integer,
    OUT shared boolean,
    OUT last_error_at timestamptz,
    OUT node text,
    OUT slots integer)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_health' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@.rl_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.rl_health() TO pg_monitor;

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
    OUT stats_reset timestamptz,
    OUT source_replay bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'rl_stats_read' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@._rl_stats_read() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@._rl_stats_read() TO pg_monitor;

CREATE VIEW @extschema@.rl_stats AS SELECT * FROM @extschema@._rl_stats_read();
REVOKE ALL ON @extschema@.rl_stats FROM PUBLIC;
GRANT SELECT ON @extschema@.rl_stats TO pg_monitor;
COMMENT ON VIEW @extschema@.rl_stats IS
    'per-policy decision counters and Redis latency of this server since the last reset; never a subject';

CREATE FUNCTION @extschema@.rl_stats_reset() RETURNS void
AS 'MODULE_PATHNAME', 'rl_stats_reset' LANGUAGE C VOLATILE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@.rl_stats_reset() FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_stats_reset() IS
    'set every rl_stats counter of this database (and the shared "(other)" row) to zero';

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

-- The one-way hash the decision log writes for a subject, to find a subject's lines.
CREATE FUNCTION @extschema@.rl_subject_hash(subject text) RETURNS text
AS 'MODULE_PATHNAME', 'rl_subject_hash' LANGUAGE C STABLE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION @extschema@.rl_subject_hash(text) FROM PUBLIC;
COMMENT ON FUNCTION @extschema@.rl_subject_hash(text) IS
    'the keyed hash that stands for a subject in the decision log';
