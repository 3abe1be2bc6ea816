-- rl_consume against Redis with an injected clock (ms since the epoch), so time is exact.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql
-- The README's policy, made anew for this file: a version (so buckets) of its own.
DELETE FROM rl_policy WHERE name = 'reports.export';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');

SET ratelimit.test_clock_ms = '1800000000000';

-- 'reports.export': 5 tokens, 100 an hour (one every 36 s); full at first.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('reports.export', 'tenant_a', 5);
-- Empty: denied, takes nothing, says when 1 token is back (36 s) and when full (180 s).
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('reports.export', 'tenant_a', 1);
SELECT allowed, remaining, retry_after_ms FROM rl_consume('reports.export', 'tenant_a', 3);
-- 35.999 s later: still nothing; 36 s: exactly one token.
SET ratelimit.test_clock_ms = '1800000035999';
SELECT allowed, remaining, retry_after_ms FROM rl_consume('reports.export', 'tenant_a');
SET ratelimit.test_clock_ms = '1800000036000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('reports.export', 'tenant_a');
-- A long idle refills to capacity, never beyond.
SET ratelimit.test_clock_ms = '1800100000000';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('reports.export', 'tenant_a', 2);
-- The clock stepping back adds nothing; time already counted is not counted twice.
SET ratelimit.test_clock_ms = '1800099000000';
SELECT allowed, remaining, retry_after_ms FROM rl_consume('reports.export', 'tenant_a', 3);
SELECT allowed, remaining, retry_after_ms FROM rl_consume('reports.export', 'tenant_a', 1);
SET ratelimit.test_clock_ms = '1800100000000';
SELECT allowed, remaining FROM rl_consume('reports.export', 'tenant_a', 1);

-- Each subject has its own bucket.
SELECT allowed, remaining FROM rl_consume('reports.export', 'tenant_b', 4);
SELECT allowed, remaining FROM rl_consume('reports.export', 'tenant_c', 1);

-- Weighted costs, and a fast policy (1000 a second: one per ms).
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('api.fast', 1000, 1000, '1 s');
SELECT allowed, remaining, reset_after_ms FROM rl_consume('api.fast', 'tenant_a', 999);
SELECT allowed, remaining, retry_after_ms FROM rl_consume('api.fast', 'tenant_a', 10);
SET ratelimit.test_clock_ms = '1800100000009';
SELECT allowed, remaining FROM rl_consume('api.fast', 'tenant_a', 10);

-- A slow policy (1 a day): retry-after rounds up to the next whole ms.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('api.slow', 3, 7, '1 day');
SELECT allowed, remaining, reset_after_ms FROM rl_consume('api.slow', 'tenant_a', 3);
SELECT allowed, retry_after_ms, reset_after_ms FROM rl_consume('api.slow', 'tenant_a', 1);

-- The decision is a composite; its fields can be used one by one.
SELECT (rl_consume('api.fast', 'tenant_z')).allowed;
-- The version that decided is the policy's current one.
SELECT d.version = p.version AS current_version
FROM rl_consume('api.fast', 'tenant_z') d JOIN rl_policy p ON p.name = d.policy;
RESET ratelimit.test_clock_ms;
SELECT allowed, capacity, policy, source FROM rl_consume('api.fast', 'tenant_now');

DELETE FROM rl_policy WHERE name IN ('reports.export', 'api.fast', 'api.slow');
