-- rl_enforce: the same decision; a denial raises RL429 with the policy and a retry-after.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql
-- The README's policy, made anew for this file: a version (so buckets) of its own.
DELETE FROM rl_policy WHERE name = 'reports.export';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');

SET ratelimit.test_clock_ms = '1900000000000';
SELECT allowed, remaining FROM rl_enforce('reports.export', 'tenant_e', 5);
SELECT expect_error($$SELECT rl_enforce('reports.export', 'tenant_e', 1)$$);
-- The whole error, as a client sees it.
SELECT rl_enforce('reports.export', 'tenant_e', 2);
-- Catchable in PL/pgSQL, by SQLSTATE, with the details a caller needs; nothing leaks the key.
DO $$
DECLARE
    message text;
    detail text;
BEGIN
    PERFORM rl_enforce('reports.export', 'tenant_e', 1);
    RAISE NOTICE 'not reached';
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
    RAISE NOTICE 'caught: % / %', message, detail;
    RAISE NOTICE 'mentions the subject or key: %', message || detail LIKE '%tenant_e%' OR message || detail LIKE '%rl:%';
END
$$;
-- Retry-after in whole seconds, rounded up: 1 ms past the refill still says 36 s.
SET ratelimit.test_clock_ms = '1900000000001';
SELECT expect_error($$SELECT rl_enforce('reports.export', 'tenant_e', 1)$$);
SET ratelimit.test_clock_ms = '1900000036000';
SELECT allowed, remaining FROM rl_enforce('reports.export', 'tenant_e', 1);

DELETE FROM rl_policy WHERE name = 'reports.export';
