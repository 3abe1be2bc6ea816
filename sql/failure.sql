-- When Redis cannot answer, the policy's fail mode decides, and says so in source.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

-- The local buckets already in use in this server (none when this file runs alone).
SELECT local_buckets_in_use AS local_buckets_before FROM rl_health() \gset
SET ratelimit.test_clock_ms = '2200000000000';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, local_share) VALUES
    ('fail.open', 10, 10, '1 s', 'open', 1),
    ('fail.closed', 10, 10, '1 s', 'closed', 1),
    ('fail.local', 10, 10, '1 s', 'local', 1),
    ('fail.half', 10, 10, '1 s', 'local', 0.5);

-- Nothing listens on port 1: connection refused. This session's own URL gets its own
-- breaker (shared = false): the server's Redis stays in use for everyone else.
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT allowed, remaining, capacity, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume('fail.open', 'tenant_f');
SELECT redis_reachable, breaker, retry_in_ms > 0 AS retry_later, last_error, shared FROM rl_health();
SELECT allowed, remaining, capacity, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume('fail.closed', 'tenant_f');

-- 'local': a bucket in shared memory with the same arithmetic as the Redis script.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('fail.local', 'tenant_f', 9);
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('fail.local', 'tenant_f', 2);
SET ratelimit.test_clock_ms = '2200000000100';
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('fail.local', 'tenant_f', 2);
-- Each subject has its own local bucket.
SELECT allowed, remaining, source FROM rl_consume('fail.local', 'tenant_g', 10);
-- local_share 0.5: half the capacity, refilled half as fast.
SELECT allowed, remaining, reset_after_ms, source FROM rl_consume('fail.half', 'tenant_f', 5);
SELECT allowed, remaining, retry_after_ms, source FROM rl_consume('fail.half', 'tenant_f', 1);
-- A cost the local bucket can never hold: closed.
SELECT allowed, source FROM rl_consume('fail.half', 'tenant_h', 6);
SELECT local_buckets_in_use - :local_buckets_before AS local_buckets_in_use, local_buckets FROM rl_health();

-- rl_enforce tells an outage (RL503, an API's 503) from a quota denial (RL429, a 429),
-- whoever decided the quota.
SELECT expect_error($$SELECT rl_enforce('fail.closed', 'tenant_f')$$);
SELECT rl_enforce('fail.closed', 'tenant_f');
SELECT expect_error($$SELECT rl_enforce('fail.local', 'tenant_g')$$);
SELECT allowed, source FROM rl_enforce('fail.open', 'tenant_f');
-- Bad input is still an error, not a fail-mode decision.
SELECT expect_error($$SELECT rl_consume('fail.open', 'tenant_f', 11)$$);

-- No Redis configured at all: the same.
SET ratelimit.redis_url = '';
SELECT allowed, source FROM rl_consume('fail.open', 'tenant_f');
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');
SELECT last_error FROM rl_health();

-- A socket that does not exist.
SET ratelimit.redis_url = 'unix:///nonexistent/redis.sock';
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');

-- Back to the server's Redis: its breaker is closed, so Redis decides at once.
RESET ratelimit.redis_url;
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');
SELECT redis_reachable, breaker, shared FROM rl_health();

DELETE FROM rl_policy WHERE name LIKE 'fail.%';
