-- When Redis cannot answer, the policy's fail mode decides, and says so in source.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('fail.open', 10, 10, '1 s', 'open'),
    ('fail.closed', 10, 10, '1 s', 'closed'),
    ('fail.local', 10, 10, '1 s', 'local');

-- Nothing listens on port 1: connection refused.
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('fail.open', 'tenant_f');
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('fail.closed', 'tenant_f');
-- 'local' acts as 'closed' until the shared local bucket exists.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume('fail.local', 'tenant_f');
-- rl_enforce tells an outage (RL503, an API's 503) from a quota denial (RL429, a 429).
SELECT expect_error($$SELECT rl_enforce('fail.closed', 'tenant_f')$$);
SELECT rl_enforce('fail.local', 'tenant_f');
SELECT allowed, source FROM rl_enforce('fail.open', 'tenant_f');
-- Bad input is still an error, not a fail-mode decision.
SELECT expect_error($$SELECT rl_consume('fail.open', 'tenant_f', 11)$$);

-- No Redis configured at all: the same.
SET ratelimit.redis_url = '';
SELECT allowed, source FROM rl_consume('fail.open', 'tenant_f');
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');

-- A socket that does not exist.
SET ratelimit.redis_url = 'unix:///nonexistent/redis.sock';
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');

-- Back to the configured Redis: decisions come from it again at once.
RESET ratelimit.redis_url;
SELECT allowed, source FROM rl_consume('fail.closed', 'tenant_f');
