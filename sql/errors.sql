-- Bad input gets the contract's SQLSTATE, never XX000 and never a NULL decision.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql
-- The README's policy, made anew for this file: a version (so buckets) of its own.
DELETE FROM rl_policy WHERE name = 'reports.export';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');

SELECT expect_error($$SELECT rl_consume('no.such.policy', 'tenant_1')$$);
SELECT expect_error($$SELECT rl_consume(NULL, 'tenant_1')$$);
SELECT expect_error($$SELECT rl_consume('reports.export', NULL)$$);
SELECT expect_error($$SELECT rl_consume('reports.export', 'tenant_1', NULL)$$);
SELECT expect_error($$SELECT rl_enforce(NULL, 'tenant_1')$$);
SELECT expect_error($$SELECT rl_enforce('reports.export', NULL)$$);
SELECT expect_error($$SELECT rl_enforce('reports.export', 'tenant_1', NULL)$$);
SELECT expect_error($$SELECT rl_consume('reports.export', 'tenant_1', 0)$$);
SELECT expect_error($$SELECT rl_consume('reports.export', 'tenant_1', -1)$$);
SELECT expect_error($$SELECT rl_consume('reports.export', 'tenant_1', 6)$$);
SELECT expect_error($$SELECT rl_enforce('reports.export', 'tenant_1', 6)$$);
SELECT expect_error($$SELECT rl_consume('reports.export', '')$$);
SELECT expect_error($$SELECT rl_consume('reports.export', repeat('x', 1025))$$);
SELECT expect_error($$SELECT rl_consume('', 'tenant_1')$$);
SELECT expect_error($$SELECT rl_consume(repeat('p', 100), 'tenant_1')$$);
-- The longest subject is accepted.
SELECT allowed, source FROM rl_consume('reports.export', repeat('x', 1024));

DELETE FROM rl_policy WHERE name = 'reports.export';
