-- Policy modes: 'enforce' (the default), 'shadow' (decide and count, never deny: the
-- source says it would have denied) and 'disabled' (allow, count nothing).

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2600000000000';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, mode) VALUES
    ('mode.shadow', 2, 2, '1 hour', 'shadow'),
    ('mode.off', 2, 2, '1 hour', 'disabled'),
    ('mode.on', 2, 2, '1 hour', 'enforce');
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, mode) VALUES ('mode.bad', 1, 1, '1 s', 'maybe')$$);

-- Shadow: tokens are counted; a denial is let through and says so.
SELECT allowed, remaining, retry_after_ms, source FROM rl_consume('mode.shadow', 'm1', 2);
SELECT allowed, remaining, retry_after_ms, source FROM rl_consume('mode.shadow', 'm1');
SELECT allowed, source FROM rl_enforce('mode.shadow', 'm1');
SELECT allowed, source FROM rl_peek('mode.shadow', 'm1');
-- Switched to enforce, the same bucket denies: shadow counted for real.
UPDATE rl_policy SET mode = 'enforce' WHERE name = 'mode.shadow';
SELECT allowed, remaining, source FROM rl_consume('mode.shadow', 'm1');
SELECT expect_error($$SELECT rl_enforce('mode.shadow', 'm1')$$);
UPDATE rl_policy SET mode = 'shadow' WHERE name = 'mode.shadow';

-- Disabled: allowed, nothing counted, Redis not asked.
SELECT allowed, remaining, source FROM rl_consume('mode.off', 'm1', 2);
SELECT allowed, remaining, source FROM rl_consume('mode.off', 'm1', 2);
SELECT allowed, source FROM rl_enforce('mode.off', 'm1', 2);
UPDATE rl_policy SET mode = 'enforce' WHERE name = 'mode.off';
SELECT allowed, remaining, source FROM rl_peek('mode.off', 'm1');
UPDATE rl_policy SET mode = 'disabled' WHERE name = 'mode.off';

-- A mode change keeps the version (and the buckets).
SELECT count(DISTINCT new->>'version') AS versions, count(*) AS changes
FROM rl_policy_history WHERE name = 'mode.shadow' AND new IS NOT NULL;

-- rl_consume_all: a short shadow check does not stop the others, a disabled one counts nothing.
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['mode.on', 'mode.shadow', 'mode.off'], ARRAY['m2', 'm2', 'm2'], ARRAY[1, 2, 2]);
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['mode.on', 'mode.shadow'], ARRAY['m2', 'm2'], ARRAY[1, 2]);
SELECT allowed, remaining FROM rl_peek('mode.on', 'm2');
SELECT policy, allowed, source
FROM rl_consume_all(ARRAY['mode.on', 'mode.shadow'], ARRAY['m2', 'm2'], ARRAY[1, 1]);

-- Redis down: a shadow policy that fails closed lets the call through, saying shadow.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, mode)
VALUES ('mode.shadow.closed', 2, 2, '1 hour', 'closed', 'shadow');
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT allowed, source FROM rl_consume('mode.shadow.closed', 'm3');
SELECT allowed, source FROM rl_consume('mode.off', 'm3');
RESET ratelimit.redis_url;

-- Leases follow the mode too.
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, mode) VALUES
    ('mode.lease.shadow', 'concurrency', 1, '1 min', 'shadow'),
    ('mode.lease.off', 'concurrency', 1, '1 min', 'disabled');
BEGIN;
SELECT allowed, remaining, source FROM rl_acquire('mode.lease.shadow', 'm4');
SELECT allowed, remaining, source FROM rl_acquire('mode.lease.shadow', 'm4');
SELECT allowed, source FROM rl_acquire('mode.lease.off', 'm4');
SELECT allowed, source FROM rl_acquire('mode.lease.off', 'm4');
COMMIT;
DELETE FROM rl_policy WHERE name LIKE 'mode.%';
