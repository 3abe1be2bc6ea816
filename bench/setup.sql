-- bench/setup.sql: what bench/run measures, in the scratch database.
\set ON_ERROR_STOP on

CREATE EXTENSION ratelimit;

-- Both policies grant a million tokens, refilled at a million a minute (16,667/s):
-- far more than the bench can take, so every decision is an allowed one, which
-- writes (the costlier path). The idle TTL keeps the wide keys for the whole run.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl) VALUES
    ('bench.wide', 1000000, 1000000, '1 minute', '10 minutes'),
    ('bench.hot',  1000000, 1000000, '1 minute', '10 minutes');
-- The same limits as GCRA (the same idle TTL, so that keys stay as long) and as a fixed
-- window of an hour: what Redis pays per decision of each, under pgbench.
INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, idle_ttl) VALUES
    ('bench.gcra', 'gcra', 1000000, 1000000, '1 minute', '10 minutes'),
    ('bench.fixed', 'fixed_window', 1000000, NULL, '1 hour', NULL);
-- bench.hot's limits with an allowance: a hot subject's takes granted from this server's
-- slices of up to 1,000 tokens (each used for at most a second).
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl, allowance, allowance_ttl) VALUES
    ('bench.allowance', 1000000, 1000000, '1 minute', '10 minutes', 1000, '1 second');
-- One token a day, taken at setup: every later decision is a denial (the deny cache's).
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES
    ('bench.denied', 1, 1, '1 day');
-- A hot subject over its limit: its tokens trickle in (1,000 a second) far slower than the
-- clients ask, with and without an allowance of 20.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl) VALUES
    ('bench.limit_allowance', 100, 1000, '1 second', 20, '1 second'),
    ('bench.limit', 100, 1000, '1 second', NULL, '1 second');

-- The baseline: the same token bucket as a user would write it without the extension,
-- one row per subject in a logged table, locked, refilled pro rata and updated.
CREATE TABLE bench_bucket (
    subject    text PRIMARY KEY,
    tokens     double precision NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE FUNCTION bench_table_consume(p_subject text, p_cost bigint DEFAULT 1,
                                    p_capacity bigint DEFAULT 1000000,
                                    p_refill_per_second double precision DEFAULT 1000000 / 60.0)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_tokens double precision;
    v_updated_at timestamptz;
    v_now timestamptz;
BEGIN
    SELECT tokens, updated_at INTO v_tokens, v_updated_at
      FROM bench_bucket WHERE subject = p_subject FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO bench_bucket VALUES (p_subject, p_capacity, clock_timestamp())
            ON CONFLICT (subject) DO NOTHING;
        SELECT tokens, updated_at INTO v_tokens, v_updated_at
          FROM bench_bucket WHERE subject = p_subject FOR UPDATE;
    END IF;
    -- Read the clock once the row is ours; a clock stepping back adds nothing.
    v_now := greatest(clock_timestamp(), v_updated_at);
    v_tokens := least(p_capacity,
                      v_tokens + extract(epoch FROM v_now - v_updated_at) * p_refill_per_second);
    IF v_tokens < p_cost THEN
        RETURN false;           -- a denial takes nothing and writes nothing
    END IF;
    UPDATE bench_bucket SET tokens = v_tokens - p_cost, updated_at = v_now
     WHERE subject = p_subject;
    RETURN true;
END
$$;

INSERT INTO bench_bucket VALUES ('tenant_hot', 1000000, clock_timestamp());

-- What redis-benchmark sends for bench.wide: the arguments decision.c derives (bucket.c's
-- units: the refill reduced by its gcd) and the key layout of subject.c, under another
-- prefix so its keys are counted apart.
CREATE VIEW bench_script_args AS
SELECT p.name, p.version,
       p.capacity * (ms / g) AS capacity_units,
       p.refill_amount / g   AS rate,
       ms / g                AS unit,
       _rl_interval_ms(p.idle_ttl)::bigint AS ttl_ms
  FROM rl_policy p,
       LATERAL (SELECT _rl_interval_ms(p.refill_period)::bigint AS ms) m,
       LATERAL (SELECT gcd(p.refill_amount, m.ms) AS g) d;

-- Phase 2 (Redis stopped, the breaker open): the same kind of decisions from the fail modes.
-- bench.open allows without a bucket. bench.local decides from a bucket in shared memory
-- holding local_share of the capacity: 50,000,000 tokens, far more than the bench takes,
-- so every decision is allowed and writes. It refills one token an hour (one every two
-- hours locally), so that what a bucket lost in the run is exactly the number of decisions
-- it took: bench/run checks that against the transactions pgbench ran.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl, fail_mode, local_share) VALUES
    ('bench.open',  1000000,   1000000, '1 minute', '10 minutes', 'open',  1),
    ('bench.local', 100000000, 1,       '1 hour',   NULL,         'local', 0.5);
