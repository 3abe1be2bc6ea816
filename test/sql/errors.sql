-- Bad input gets the contract's SQLSTATE, never XX000 and never a NULL decision.
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
