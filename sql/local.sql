-- The local fallback bucket (C, src/algorithm/) and the Redis script (Lua) make the same
-- decisions: one sequence of (time, cost), with the clock stepping back now and then,
-- is run against Redis and against a local bucket, and every answer is compared; for the
-- token bucket, GCRA, the fixed and the sliding window, the sliding log. (The windows' sequence only steps
-- forward: a clock that steps back across a window's start counts in the earlier
-- window's own key in Redis, and, conservatively, on in the later one in the one local
-- slot. A sliding log is kept in C up to 8 tokens, as this one; a longer log's fallback is
-- a fixed window, not the same answers by design.)

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('eq.odd.redis', 7, 3, '1 s', 'closed'),
    ('eq.odd.local', 7, 3, '1 s', 'local'),
    ('eq.minute.redis', 10, 120, '1 min', 'closed'),
    ('eq.minute.local', 10, 120, '1 min', 'local');
-- (GCRA's keys live until their arrival time on Redis's own clock, which the test clock
-- outruns: an idle_ttl keeps them for the whole run.)
INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode) VALUES
    ('eq.gcra.redis', 'gcra', 7, 3, '1 s', '1 hour', 'closed'),
    ('eq.gcra.local', 'gcra', 7, 3, '1 s', '1 hour', 'local'),
    ('eq.fixed.redis', 'fixed_window', 7, NULL, '5 s', NULL, 'closed'),
    ('eq.fixed.local', 'fixed_window', 7, NULL, '5 s', NULL, 'local'),
    ('eq.sliding.redis', 'sliding_window', 7, NULL, '5 s', NULL, 'closed'),
    ('eq.sliding.local', 'sliding_window', 7, NULL, '5 s', NULL, 'local'),
    ('eq.log.redis', 'sliding_log', 6, NULL, '3 s', NULL, 'closed'),
    ('eq.log.local', 'sliding_log', 6, NULL, '3 s', NULL, 'local');

SELECT setseed(0.42);
CREATE TEMP TABLE steps AS
SELECT i, (floor(random() * 1800) - 300)::bigint AS step_ms, 1 + floor(random() * 7)::bigint AS cost
FROM generate_series(1, 400) AS i;

CREATE TEMP TABLE answers (kind text, policy text, i int, allowed boolean, remaining bigint,
                           retry_after_ms bigint, reset_after_ms bigint, source text);

-- Runs the steps against p_policy, recording each answer under p_kind.
CREATE FUNCTION pg_temp.run_steps(p_kind text, p_policy text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := 2300000000000;
    step record;
BEGIN
    FOR step IN SELECT * FROM steps ORDER BY i LOOP
        IF p_policy LIKE 'eq.fixed.%' OR p_policy LIKE 'eq.sliding.%' THEN
            now_ms := now_ms + abs(step.step_ms);
        ELSE
            now_ms := now_ms + step.step_ms;
        END IF;
        PERFORM set_config('ratelimit.test_clock_ms', now_ms::text, false);
        INSERT INTO answers
        SELECT p_kind, p_policy, step.i, d.allowed, d.remaining, d.retry_after_ms,
               d.reset_after_ms, d.source
        FROM rl_consume(p_policy, 'tenant_eq',
                        least(step.cost, (SELECT capacity FROM rl_policy WHERE name = p_policy))) AS d;
    END LOOP;
END
$$;

SELECT pg_temp.run_steps('redis', 'eq.odd.redis');
SELECT pg_temp.run_steps('redis', 'eq.minute.redis');
SELECT pg_temp.run_steps('redis', 'eq.gcra.redis');
SELECT pg_temp.run_steps('redis', 'eq.fixed.redis');
SELECT pg_temp.run_steps('redis', 'eq.sliding.redis');
SELECT pg_temp.run_steps('redis', 'eq.log.redis');
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT pg_temp.run_steps('local', 'eq.odd.local');
SELECT pg_temp.run_steps('local', 'eq.minute.local');
SELECT pg_temp.run_steps('local', 'eq.gcra.local');
SELECT pg_temp.run_steps('local', 'eq.fixed.local');
SELECT pg_temp.run_steps('local', 'eq.sliding.local');
SELECT pg_temp.run_steps('local', 'eq.log.local');
RESET ratelimit.redis_url;

-- Who decided, and how often each way: both sides grant and deny many times.
SELECT kind, policy, source, count(*) AS decisions, count(*) FILTER (WHERE allowed) AS granted
FROM answers GROUP BY 1, 2, 3 ORDER BY 1, 2;
-- Every answer the same.
SELECT r.policy, count(*) AS steps,
       count(*) FILTER (WHERE (r.allowed, r.remaining, r.retry_after_ms, r.reset_after_ms)
                              IS NOT DISTINCT FROM (l.allowed, l.remaining, l.retry_after_ms, l.reset_after_ms)) AS same
FROM answers r
JOIN answers l ON l.kind = 'local' AND l.i = r.i AND l.policy = replace(r.policy, '.redis', '.local')
WHERE r.kind = 'redis'
GROUP BY 1 ORDER BY 1;
-- The clock stepped back often enough to matter.
SELECT count(*) FILTER (WHERE step_ms < 0) > 50 AS many_backward_steps FROM steps;

DELETE FROM rl_policy WHERE name LIKE 'eq.%';
