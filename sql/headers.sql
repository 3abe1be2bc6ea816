-- HTTP: rl_headers turns a decision into response headers (IETF RateLimit-Policy and
-- RateLimit, Retry-After when denied; legacy => true gives RateLimit-Limit/-Remaining/-Reset),
-- rl_response_headers adds them to PostgREST's response.headers, and with
-- ratelimit.postgrest_errors rl_enforce raises the PGRST error PostgREST answers 429 or 503 with.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2700000000000';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, mode) VALUES
    ('http.api', 10, 10, '1 minute', 'closed', 'enforce'),      -- a token every 6 s, w=60
    ('http.odd', 5, 2, '1 s', 'closed', 'enforce'),             -- full in 2.5 s: w=3, rounded up
    ('http.open', 10, 10, '1 minute', 'open', 'enforce'),
    ('http.shadow', 1, 1, '1 minute', 'closed', 'shadow'),
    ('http.off', 10, 10, '1 minute', 'closed', 'disabled'),
    ('http.local', 10, 10, '1 minute', 'local', 'enforce');
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES
    ('http.lease', 'concurrency', 2, '1 min');

--
-- Decided by Redis: the policy, what is left, and Retry-After only when denied.
--
-- Allowed: 9 left; the bucket is full again in 6 s (t), an empty one in 60 s (w).
SELECT d.allowed, d.remaining, d.reset_after_ms, rl_headers(d) AS headers
FROM rl_consume('http.api', 'h1') d;
-- Exhausted but allowed: r=0, full in 60 s, no Retry-After (this call was granted).
SELECT d.allowed, d.remaining, d.reset_after_ms, rl_headers(d) AS headers
FROM rl_consume('http.api', 'h1', 9) d;
-- Denied: Retry-After in whole seconds, rounded up: 1001 ms is 2, 1000 ms is 1, 1 ms is 1.
-- t rounds up too: 55001 ms is 56.
SET ratelimit.test_clock_ms = '2700000004999';
SELECT d.allowed, d.retry_after_ms, d.reset_after_ms, rl_headers(d) AS headers
FROM rl_consume('http.api', 'h1') d;
SET ratelimit.test_clock_ms = '2700000005000';
SELECT d.allowed, d.retry_after_ms, rl_headers(d)->>'Retry-After' AS retry_after
FROM rl_consume('http.api', 'h1') d;
SET ratelimit.test_clock_ms = '2700000005999';
SELECT d.allowed, d.retry_after_ms, rl_headers(d)->>'Retry-After' AS retry_after
FROM rl_consume('http.api', 'h1') d;
-- The same, legacy: RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
SELECT d.allowed, rl_headers(d, legacy => true) AS headers
FROM rl_consume('http.api', 'h1') d;
SET ratelimit.test_clock_ms = '2700000060000';
SELECT d.allowed, rl_headers(d, true) AS headers FROM rl_consume('http.api', 'h1') d;
-- The window rounds up: an empty bucket of 5 at 2 a second is full in 2.5 s.
SELECT rl_headers(d) AS headers FROM rl_consume('http.odd', 'h1', 5) d;
-- Values are always strings; header names as HTTP writes them.
SELECT key, jsonb_typeof(value) AS type
FROM rl_consume('http.api', 'h1', 10) d, jsonb_each(rl_headers(d)) ORDER BY key;

--
-- Who decided changes what can be said.
--
-- Disabled: no bucket was asked, so nothing is left to tell but the policy.
SELECT d.source, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_consume('http.off', 'h1') d;
-- Shadow: the limit is only watched, so a client sees none, allowed or "would deny".
SELECT d.source, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_consume('http.shadow', 'h1') d;
SELECT d.allowed, d.source, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_consume('http.shadow', 'h1') d;
-- Redis unreachable: fail_open tells only the policy; fail_closed (a 503) the policy and
-- when to retry (the breaker's retry interval, 1 s), never a remaining count.
BEGIN;
SET LOCAL ratelimit.redis_url = 'redis://127.0.0.1:1';
SET LOCAL ratelimit.connect_timeout = '200ms';
SET LOCAL ratelimit.command_timeout = '200ms';
SELECT d.allowed, d.source, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_consume('http.open', 'h1') d;
SELECT d.allowed, d.source, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_consume('http.api', 'h1') d;
-- A local fallback bucket counts like Redis: what is left is told.
SELECT d.allowed, d.source, rl_headers(d) AS headers
FROM rl_consume('http.local', 'h1', 4) d;
COMMIT;

-- Overrides: 'allow' asks no bucket (the policy only); 'deny' has nothing left until it
-- expires (at 90.5 s, the clock is at 60 s: 31); 'limit' has a bucket and limits of its own.
INSERT INTO rl_override (policy, subject, action, expires_at) VALUES
    ('http.api', 'vip', 'allow', NULL),
    ('http.api', 'abuser', 'deny', to_timestamp(2700000090.5));
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
VALUES ('http.api', 'big', 100, 100, '10 s');
SELECT d.allowed, d.source, rl_headers(d) AS headers FROM rl_consume('http.api', 'vip') d;
SELECT d.allowed, d.source, d.retry_after_ms, rl_headers(d) AS headers
FROM rl_consume('http.api', 'abuser') d;
SELECT rl_headers(d, true) AS legacy FROM rl_consume('http.api', 'abuser') d;
CREATE TEMPORARY TABLE kept AS SELECT d FROM rl_consume('http.api', 'big') d;
SELECT (d).capacity, (d).remaining, rl_headers(d) AS headers FROM kept;
-- Once the override is gone, its version is no current limit: no window, the rest as decided.
DELETE FROM rl_override WHERE policy = 'http.api';
SELECT rl_headers(d) AS headers FROM kept;
DROP TABLE kept;

-- A concurrency policy: leases held at once, no window.
BEGIN;
SELECT d.remaining, rl_headers(d) AS headers, rl_headers(d, true) AS legacy
FROM rl_acquire('http.lease', 'h1') d;
COMMIT;

--
-- A decision built by hand.
--
-- An unknown policy: what the decision itself says (q without w, r, t, Retry-After).
SELECT rl_headers(ROW(true, 3, 10, 0, 1500, 'no.such', 1, 'redis', 0)::rl_decision) AS headers;
SELECT rl_headers(ROW(false, 0, 10, 1001, 5000, 'no.such', 1, 'redis', 0)::rl_decision) AS headers;
-- A version of http.api that is not (or no longer) current: the same.
SELECT rl_headers(ROW(true, 3, 10, 0, 1500, 'http.api', -1, 'redis', 0)::rl_decision) AS headers;
-- Never a negative count, and a denial always says to wait at least a second.
SELECT rl_headers(ROW(false, -5, 10, 0, -1, 'no.such', 1, 'local', 0)::rl_decision) AS headers;
-- Quotes and backslashes are escaped inside the structured-field string.
SELECT rl_headers(ROW(true, 1, 2, 0, 0, 'we"ird\name', 1, 'redis', 0)::rl_decision)->>'RateLimit-Policy' AS policy;
-- Bad input is an error, never an empty object that reads as "no limit".
SELECT expect_error($$SELECT rl_headers(NULL)$$);
SELECT expect_error($$SELECT rl_headers(NULL::rl_decision, true)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 2, 0, 0, 'http.api', 1, 'redis', 0)::rl_decision, NULL)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, NULL, 2, 0, 0, 'http.api', 1, 'redis', 0)::rl_decision)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 2, 0, 0, NULL, 1, 'redis', 0)::rl_decision)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 2, 0, 0, 'http.api', 1, 'magic', 0)::rl_decision)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 2, 0, 0, E'line\nbreak', 1, 'redis', 0)::rl_decision)$$);
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 2, 0, 0, repeat('x', 64), 1, 'redis', 0)::rl_decision)$$);

--
-- rl_response_headers: appends the headers to response.headers (an array of one-key
-- objects, as PostgREST reads it) for this transaction, and returns the decision.
--
SET ratelimit.test_clock_ms = '2700000200000';
BEGIN;
SELECT coalesce(nullif(current_setting('response.headers', true), ''), '(none)') AS before;
SELECT allowed, remaining FROM rl_response_headers(rl_consume('http.api', 'h3'));
SELECT current_setting('response.headers')::jsonb AS response_headers;
-- What was there stays; the next decision's headers follow it.
SELECT set_config('response.headers', '[{"Cache-Control": "no-store"}]', true) IS NOT NULL AS set;
SELECT allowed FROM rl_response_headers(rl_consume('http.api', 'h3'), legacy => true);
SELECT current_setting('response.headers')::jsonb AS response_headers;
-- A shadow policy adds nothing.
SELECT allowed FROM rl_response_headers(rl_consume('http.shadow', 'h3'));
SELECT jsonb_array_length(current_setting('response.headers')::jsonb) AS headers;
COMMIT;
-- Transaction-local: gone after commit.
SELECT coalesce(nullif(current_setting('response.headers', true), ''), '(none)') AS after;
SELECT expect_error($$SELECT rl_response_headers(NULL)$$);

--
-- ratelimit.postgrest_errors: a denied rl_enforce raises SQLSTATE PGRST, whose message
-- (the response body) and detail (status and headers) are JSON objects.
--
CREATE FUNCTION pg_temp.postgrest_error(p text, s text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    message text;
    detail text;
    state text;
BEGIN
    PERFORM rl_enforce(p, s);
    RETURN NULL;
EXCEPTION WHEN SQLSTATE 'PGRST' THEN
    GET STACKED DIAGNOSTICS message = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                            state = RETURNED_SQLSTATE;
    RETURN jsonb_build_object('sqlstate', state, 'message_text', message, 'detail_text', detail,
                              'message', message::jsonb, 'detail', detail::jsonb,
                              'names_subject', strpos(message || detail, s) > 0);
END
$$;
-- Every field of a raised error, and that every header value is a string.
CREATE FUNCTION pg_temp.postgrest_fields(e jsonb) RETURNS TABLE (field text, value text)
LANGUAGE sql AS $$
    SELECT 'sqlstate', e->>'sqlstate'
    UNION ALL SELECT 'message keys', (SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(e->'message') k)
    UNION ALL SELECT 'code', e->'message'->>'code'
    UNION ALL SELECT 'message', e->'message'->>'message'
    UNION ALL SELECT 'details', e->'message'->>'details'
    UNION ALL SELECT 'hint', e->'message'->>'hint'
    UNION ALL SELECT 'detail keys', (SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys(e->'detail') k)
    UNION ALL SELECT 'status', (e->'detail'->'status')::text || ' (' || jsonb_typeof(e->'detail'->'status') || ')'
    UNION ALL SELECT 'status_text', e->'detail'->>'status_text'
    UNION ALL SELECT 'header ' || key, (value #>> '{}') || ' (' || jsonb_typeof(value) || ')'
              FROM jsonb_each(e->'detail'->'headers')
    UNION ALL SELECT 'names subject', (e->>'names_subject')
$$;

SET ratelimit.test_clock_ms = '2700000300000';
-- Off (the default): rl_enforce raises RL429 as always.
SELECT allowed FROM rl_consume('http.api', 'secret-subject-1', 10);
SELECT expect_error($$SELECT rl_enforce('http.api', 'secret-subject-1')$$);
SET ratelimit.postgrest_errors = on;
-- A grant raises nothing.
SELECT pg_temp.postgrest_error('http.api', 'secret-subject-2') AS error;
-- A quota denial: 429, RL429, the IETF headers and Retry-After.
SELECT pg_temp.postgrest_error('http.api', 'secret-subject-1') ->> 'message_text' AS message;
SELECT pg_temp.postgrest_error('http.api', 'secret-subject-1') ->> 'detail_text' AS detail;
SELECT * FROM pg_temp.postgrest_fields(pg_temp.postgrest_error('http.api', 'secret-subject-1'));
-- A 'deny' override is a quota denial too (r=0 until it expires, a day when it never does).
INSERT INTO rl_override (policy, subject, action) VALUES ('http.api', 'secret-subject-3', 'deny');
SELECT * FROM pg_temp.postgrest_fields(pg_temp.postgrest_error('http.api', 'secret-subject-3'));
DELETE FROM rl_override WHERE policy = 'http.api';
-- Redis unreachable under a closed policy: 503, RL503.
BEGIN;
SET LOCAL ratelimit.redis_url = 'redis://127.0.0.1:1';
SET LOCAL ratelimit.connect_timeout = '200ms';
SET LOCAL ratelimit.command_timeout = '200ms';
SELECT * FROM pg_temp.postgrest_fields(pg_temp.postgrest_error('http.api', 'secret-subject-4'));
COMMIT;
-- Outside a PL/pgSQL block the client sees the error as it is, without the statement.
SELECT rl_enforce('http.api', 'secret-subject-1');
RESET ratelimit.postgrest_errors;

-- Under parallel query rl_headers stays in the leader (it may load the policy cache,
-- which a parallel worker cannot): no error.
CREATE TABLE http_decisions AS SELECT d FROM rl_peek('http.api', 'parallel') d;
SET force_parallel_mode = on;
SELECT rl_headers(d) ? 'RateLimit-Policy' AS has_policy FROM http_decisions;
RESET force_parallel_mode;
DROP TABLE http_decisions;

DELETE FROM rl_policy WHERE name LIKE 'http.%';
RESET ratelimit.test_clock_ms;
