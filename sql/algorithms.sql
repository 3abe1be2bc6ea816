-- The algorithms other than the token bucket: gcra, fixed_window (calendar windows in a
-- time zone), sliding_window and sliding_log, through every function, on the test clock.
-- (Their C models against their scripts: sql/local.sql; their scripts alone and the
-- calendar's edges: test/t/012_lua_algorithms.pl; the exact race: test/t/020.)

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

-- 2026-12-01 00:00:00 UTC.
SET ratelimit.test_clock_ms = '1796083200000';

--
-- Policies: each algorithm's fields, and its bounds.
--
INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES
    ('alg.gcra', 'gcra', 5, 1, '1 s');
INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone) VALUES
    ('alg.fixed', 'fixed_window', 3, '1 minute', 'UTC'),
    ('alg.day', 'fixed_window', 2, '1 day', 'Europe/Berlin'),
    ('alg.month', 'fixed_window', 1000, '1 mon', 'Europe/Berlin'),
    ('alg.odd', 'fixed_window', 2, '7 s', 'UTC'),
    ('alg.sliding', 'sliding_window', 4, '10 s', 'UTC'),
    ('alg.log', 'sliding_log', 3, '10 s', 'UTC');
SELECT name, algorithm, capacity, refill_amount, refill_period, idle_ttl, time_zone
FROM rl_policy WHERE name LIKE 'alg.%' ORDER BY name;
-- A window has no refill_amount and no idle_ttl; a refilling algorithm needs both.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES ('alg.bad', 'fixed_window', 3, 3, '1 min')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period, idle_ttl) VALUES ('alg.bad', 'sliding_log', 3, '1 min', '1 hour')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity) VALUES ('alg.bad', 'sliding_window', 3)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'gcra', 3, '1 min')$$);
-- Months are a fixed window's only, and only one month or one year.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'sliding_window', 3, '1 mon')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES ('alg.bad', 'gcra', 3, 1, '1 year')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'fixed_window', 3, '2 mons')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'fixed_window', 3, '1 mon 1 day')$$);
-- Time zones: any PostgreSQL knows, for a fixed window only.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone) VALUES ('alg.bad', 'fixed_window', 3, '1 day', 'Mars/Olympus')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone) VALUES ('alg.bad', 'sliding_window', 3, '1 day', 'Europe/Berlin')$$);
-- Bounds: GCRA's rate (refill_amount / gcd) at most 512; a log at most 10,000 tokens;
-- a sliding window's capacity * window below 2^51.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES ('alg.bad', 'gcra', 10, 513, '1 ms')$$);
INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES ('alg.bad', 'gcra', 10, 512, '1 ms');
DELETE FROM rl_policy WHERE name = 'alg.bad';
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'sliding_log', 10001, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('alg.bad', 'sliding_window', 2251799813686, '1 s')$$);

--
-- gcra: the token bucket's answers, one integer stored.
--
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('alg.gcra', 'g1', 2);
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('alg.gcra', 'g1', 3);
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('alg.gcra', 'g1', 1);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('alg.gcra', 'g1');
-- 1.5 s later: one token back (and half the next).
SET ratelimit.test_clock_ms = '1796083201500';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.gcra', 'g1', 2);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.gcra', 'g1', 1);
SELECT allowed, remaining, reset_after_ms FROM rl_refund('alg.gcra', 'g1', 2);
SELECT expect_error($$SELECT rl_enforce('alg.gcra', 'g1', 3)$$);
SELECT rl_reset('alg.gcra', 'g1');
SELECT allowed, remaining FROM rl_peek('alg.gcra', 'g1', 5);

--
-- fixed_window: at most capacity per window; the count starts again at the boundary.
--
-- 00:00:00 UTC, a minute window: 60 s left.
SET ratelimit.test_clock_ms = '1796083200000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_consume('alg.fixed', 'f1', 2);
SET ratelimit.test_clock_ms = '1796083259999';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.fixed', 'f1');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.fixed', 'f1');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('alg.fixed', 'f1');
-- The next window: a new count, whatever the last one held.
SET ratelimit.test_clock_ms = '1796083260000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.fixed', 'f1', 3);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_refund('alg.fixed', 'f1', 1);
SELECT allowed, remaining FROM rl_consume('alg.fixed', 'f1');
SELECT allowed, remaining FROM rl_consume('alg.fixed', 'f1');
SELECT rl_reset('alg.fixed', 'f1');
SELECT allowed, remaining FROM rl_consume('alg.fixed', 'f1', 3);
-- A window that is not a calendar unit is aligned to the epoch: 7 s windows.
SET ratelimit.test_clock_ms = '1796083200003';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.odd', 'o1', 2);
-- Calendar windows in Europe/Berlin: 2026-12-01 00:00 UTC is 01:00 local, so the day
-- window ends at 23:00 UTC (82,800,000 ms) and the month's at 2026-12-31 23:00 UTC.
SET ratelimit.test_clock_ms = '1796083200000';
SELECT allowed, remaining, reset_after_ms, reset_after_ms / 3600000.0 AS hours FROM rl_consume('alg.day', 'd1');
SELECT allowed, remaining, reset_after_ms, reset_after_ms / 86400000.0 AS days FROM rl_consume('alg.month', 'm1', 10);
-- At local midnight a new day begins; a ms before it, the old day still counts.
SET ratelimit.test_clock_ms = '1796166000000';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.day', 'd1');
SET ratelimit.test_clock_ms = '1796165999999';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.day', 'd1');
SELECT allowed, remaining, retry_after_ms FROM rl_consume('alg.day', 'd1');
-- DST: in Berlin, 2026-03-29 lasts 23 hours and 2026-10-25 lasts 25.
-- (2026-03-28 23:00 UTC is local midnight of the 29th; 2026-10-24 22:00 UTC that of the 25th.)
SET ratelimit.test_clock_ms = '1774738800000';
SELECT reset_after_ms / 3600000.0 AS hours FROM rl_consume('alg.day', 'dst1');
SET ratelimit.test_clock_ms = '1792879200000';
SELECT reset_after_ms / 3600000.0 AS hours FROM rl_consume('alg.day', 'dst2');
-- Days whose midnight is skipped (the clocks jump from 00:00 to 01:00) begin at 01:00 and
-- end at the next midnight: 23 hours, so at noon 12 hours are left, for the reset and the
-- retry-after alike (Santiago 2026-09-06, Beirut 2026-03-29, Havana 2026-03-08).
INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone) VALUES
    ('alg.santiago', 'fixed_window', 1, '1 day', 'America/Santiago'),
    ('alg.beirut', 'fixed_window', 1, '1 day', 'Asia/Beirut'),
    ('alg.havana', 'fixed_window', 1, '1 day', 'America/Havana');
SELECT (extract(epoch FROM '2026-09-06 12:00 America/Santiago'::timestamptz) * 1000)::bigint AS noon \gset
SET ratelimit.test_clock_ms = :'noon';
SELECT allowed, reset_after_ms / 3600000.0 AS reset_hours FROM rl_consume('alg.santiago', 'skip');
SELECT allowed, retry_after_ms / 3600000.0 AS retry_hours FROM rl_consume('alg.santiago', 'skip');
SELECT (extract(epoch FROM '2026-03-29 12:00 Asia/Beirut'::timestamptz) * 1000)::bigint AS noon \gset
SET ratelimit.test_clock_ms = :'noon';
SELECT allowed, reset_after_ms / 3600000.0 AS reset_hours FROM rl_consume('alg.beirut', 'skip');
SELECT allowed, retry_after_ms / 3600000.0 AS retry_hours FROM rl_consume('alg.beirut', 'skip');
SELECT (extract(epoch FROM '2026-03-08 12:00 America/Havana'::timestamptz) * 1000)::bigint AS noon \gset
SET ratelimit.test_clock_ms = :'noon';
SELECT allowed, reset_after_ms / 3600000.0 AS reset_hours FROM rl_consume('alg.havana', 'skip');
SELECT allowed, retry_after_ms / 3600000.0 AS retry_hours FROM rl_consume('alg.havana', 'skip');
DELETE FROM rl_policy WHERE name IN ('alg.santiago', 'alg.beirut', 'alg.havana');
-- The hour repeated when Berlin's clocks go back (2026-10-25, 02:00-03:00 twice: 00:00 and
-- 01:00 UTC) is two hour windows of one hour each, and its minutes last a minute.
INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone) VALUES
    ('alg.hour', 'fixed_window', 2, '1 hour', 'Europe/Berlin'),
    ('alg.minute', 'fixed_window', 2, '1 minute', 'Europe/Berlin');
SET ratelimit.test_clock_ms = '1792888200000';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.hour', 'fall', 2);
SET ratelimit.test_clock_ms = '1792891800000';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.hour', 'fall', 2);
SET ratelimit.test_clock_ms = '1792888210000';
SELECT allowed, remaining, reset_after_ms FROM rl_consume('alg.minute', 'fall');
-- Months: February 2028 (a leap year) has 29 days, January 31, in Berlin time.
SET ratelimit.test_clock_ms = '1832972400000';
SELECT reset_after_ms / 86400000.0 AS days FROM rl_consume('alg.month', 'leap');
SET ratelimit.test_clock_ms = '1830294000000';
SELECT reset_after_ms / 86400000.0 AS days FROM rl_consume('alg.month', 'january');
-- A change of time zone is a new version (new windows, new keys).
SELECT version AS before FROM rl_policy WHERE name = 'alg.day' \gset
UPDATE rl_policy SET time_zone = 'America/New_York' WHERE name = 'alg.day';
SELECT version > :before AS bumped FROM rl_policy WHERE name = 'alg.day';
UPDATE rl_policy SET time_zone = 'Europe/Berlin' WHERE name = 'alg.day';

--
-- sliding_window: the previous window's count weighs as much as it still overlaps.
--
-- 2 s into a 10 s window.
SET ratelimit.test_clock_ms = '1796083202000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.sliding', 's1', 4);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.sliding', 's1');
-- 5 s into the next: the previous 4 weigh 4 * 5/10 = 2; 2 more fit.
SET ratelimit.test_clock_ms = '1796083215000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.sliding', 's1', 2);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.sliding', 's1');
SELECT allowed, remaining, retry_after_ms FROM rl_peek('alg.sliding', 's1');
SELECT allowed, remaining FROM rl_refund('alg.sliding', 's1', 1);
SELECT allowed, remaining FROM rl_consume('alg.sliding', 's1');
SELECT rl_reset('alg.sliding', 's1');
SELECT allowed, remaining FROM rl_consume('alg.sliding', 's1', 4);

--
-- sliding_log: exact in every window of its length.
--
SET ratelimit.test_clock_ms = '1796083200000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.log', 'l1', 2);
SET ratelimit.test_clock_ms = '1796083204000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.log', 'l1');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.log', 'l1');
-- The first two leave the window at 10 s: one of them makes room for 1, both for 2.
SET ratelimit.test_clock_ms = '1796083210000';
SELECT allowed, remaining, retry_after_ms FROM rl_peek('alg.log', 'l1', 3);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_consume('alg.log', 'l1', 2);
SELECT allowed, remaining FROM rl_refund('alg.log', 'l1', 1);
SELECT allowed, remaining FROM rl_consume('alg.log', 'l1');
SELECT rl_reset('alg.log', 'l1');
SELECT allowed, remaining FROM rl_peek('alg.log', 'l1', 3);
-- At its largest capacity, any cost up to it, decided by Redis: ten takes of 5,000 on
-- 10,000 a day grant exactly two.
INSERT INTO rl_policy (name, algorithm, capacity, refill_period, fail_mode) VALUES
    ('alg.log.big', 'sliding_log', 10000, '1 day', 'open');
SELECT count(*) FILTER (WHERE d.allowed) AS granted, count(*) FILTER (WHERE d.source = 'redis') AS by_redis,
       min(d.remaining) AS remaining
FROM generate_series(1, 10) AS g, LATERAL rl_consume('alg.log.big', 'big', 5000 + 0 * g) AS d;
SELECT allowed, remaining, source FROM rl_consume('alg.log.big', 'other', 10000);
SELECT allowed, remaining FROM rl_refund('alg.log.big', 'other', 3333);
SELECT allowed, remaining FROM rl_consume('alg.log.big', 'other', 3334);
DELETE FROM rl_policy WHERE name = 'alg.log.big';

--
-- Every algorithm through the other functions.
--
SET ratelimit.test_clock_ms = '1796090000000';
-- rl_consume_all mixes algorithms: all granted, or none charged.
SELECT policy, allowed, remaining, retry_after_ms
FROM rl_consume_all(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log'],
                    ARRAY['all', 'all', 'all', 'all'], ARRAY[2, 2, 2, 2]);
SELECT policy, allowed, remaining, retry_after_ms
FROM rl_consume_all(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log'],
                    ARRAY['all', 'all', 'all', 'all'], ARRAY[1, 2, 1, 1]);
SELECT p AS policy, d.remaining
FROM unnest(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log']) AS p, LATERAL rl_peek(p, 'all') d;
-- The same subject twice in one group: the costs add up (a log: 1 + 2 of 3; gcra: 2 + 2
-- of 5, then 1 + 1 of the 1 left is too much, so neither is charged).
SELECT policy, allowed, remaining
FROM rl_consume_all(ARRAY['alg.log', 'alg.log'], ARRAY['twice', 'twice'], ARRAY[1, 2]);
SELECT policy, allowed, remaining
FROM rl_consume_all(ARRAY['alg.gcra', 'alg.gcra'], ARRAY['twice', 'twice'], ARRAY[2, 2]);
SELECT policy, allowed, remaining
FROM rl_consume_all(ARRAY['alg.gcra', 'alg.gcra'], ARRAY['twice', 'twice'], ARRAY[1, 1]);

-- rl_reserve: a rollback gives back, to the window the tokens were taken in.
BEGIN;
SELECT p AS policy, d.allowed, d.remaining
FROM unnest(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log']) AS p, LATERAL rl_reserve(p, 'res', 2) d;
ROLLBACK;
SELECT p AS policy, d.remaining
FROM unnest(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log']) AS p, LATERAL rl_peek(p, 'res') d;
BEGIN;
SELECT allowed, remaining FROM rl_reserve('alg.fixed', 'res2', 3);
-- The window ends before the rollback: nothing goes back to the next one.
SET ratelimit.test_clock_ms = '1796090040000';
SELECT allowed, remaining FROM rl_consume('alg.fixed', 'res2', 1);
ROLLBACK;
SET ratelimit.test_clock_ms = '1796090040000';
SELECT allowed, remaining FROM rl_peek('alg.fixed', 'res2');

-- rl_limit_trigger: one token per row, the rows over the limit refused.
CREATE TABLE alg_rows (tenant text);
CREATE TRIGGER alg_rows_limit BEFORE INSERT ON alg_rows
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('alg.log', 'tenant');
INSERT INTO alg_rows VALUES ('t1'), ('t1'), ('t1');
INSERT INTO alg_rows VALUES ('t1');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM alg_rows;
DROP TABLE alg_rows;

-- rl_headers: the window is the algorithm's (a fixed window's: the one counting now).
SELECT rl_headers(d) FROM rl_consume('alg.fixed', 'h1') d;
SELECT rl_headers(d) FROM rl_consume('alg.gcra', 'h1') d;
SELECT rl_headers(d) FROM rl_consume('alg.sliding', 'h1') d;
SELECT rl_headers(d) FROM rl_consume('alg.month', 'h1') d;

-- Overrides: a 'limit' sets a window algorithm's capacity (no refill), a gcra's refill too.
INSERT INTO rl_override (policy, subject, capacity) VALUES ('alg.fixed', 'vip', 10), ('alg.log', 'vip', 5);
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('alg.gcra', 'vip', 10, 10, '1 s');
INSERT INTO rl_override (policy, subject, action) VALUES ('alg.sliding', 'vip', 'deny');
SELECT expect_error($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('alg.fixed', 'x', 10, 10, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_override (policy, subject, capacity) VALUES ('alg.gcra', 'x', 10)$$);
SELECT expect_error($$INSERT INTO rl_override (policy, subject, capacity) VALUES ('alg.log', 'x', 20000)$$);
SELECT p AS policy, d.allowed, d.remaining, d.capacity, d.source
FROM unnest(ARRAY['alg.gcra', 'alg.fixed', 'alg.sliding', 'alg.log']) AS p, LATERAL rl_consume(p, 'vip', 4) d;
DELETE FROM rl_override WHERE policy LIKE 'alg.%';

-- Shadow and disabled modes.
UPDATE rl_policy SET mode = 'shadow' WHERE name = 'alg.log';
SELECT allowed, remaining, source FROM rl_consume('alg.log', 'shadow', 3);
SELECT allowed, remaining, source FROM rl_consume('alg.log', 'shadow', 1);
UPDATE rl_policy SET mode = 'disabled' WHERE name = 'alg.log';
SELECT allowed, remaining, source FROM rl_consume('alg.log', 'shadow', 3);
UPDATE rl_policy SET mode = 'enforce' WHERE name = 'alg.log';

-- rl_define for each algorithm: a window's amount is its capacity.
SELECT name, algorithm, capacity, refill_amount, refill_period, time_zone
FROM rl_define('alg.defined', 1000, per => '1 mon', algorithm => 'fixed_window', time_zone => 'Europe/Berlin');
SELECT name, algorithm, capacity, refill_amount, refill_period, time_zone
FROM rl_define('alg.defined', 5, per => '10 min', algorithm => 'sliding_log');
SELECT name, algorithm, capacity, refill_amount, refill_period, time_zone
FROM rl_define('alg.defined', 120, per => '1 min', burst => 10, algorithm => 'gcra');
-- Changing the algorithm is a new version.
SELECT count(DISTINCT new->>'version') AS versions FROM rl_policy_history WHERE name = 'alg.defined';

-- Meaningless calls: leases are only for concurrency policies (42809).
SELECT expect_error($$SELECT rl_acquire('alg.fixed', 'x')$$);

-- rl_stats counts every algorithm's decisions.
SELECT policy, allowed > 0 AS counted FROM rl_stats WHERE policy LIKE 'alg.%' ORDER BY policy;

RESET ratelimit.test_clock_ms;
DELETE FROM rl_policy WHERE name LIKE 'alg.%';
