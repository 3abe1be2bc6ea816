-- Allowances: a hot subject's takes granted from this server's slice of its tokens, on
-- the test clock. (Four servers sharing one bucket, and one killed holding a slice:
-- test/t/200_allowances.pl.)

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

-- 2026-12-01 00:00:00 UTC.
SET ratelimit.test_clock_ms = '1796083200000';

-- n takes of cost 1 of (policy, subject): how many each source decided, and granted.
CREATE FUNCTION pg_temp.takes(p text, s text, n int, cost bigint DEFAULT 1)
RETURNS TABLE (source text, allowed boolean, decisions bigint) LANGUAGE plpgsql AS $$
DECLARE
    d rl_decision;
    got text[] := '{}';
    ok boolean[] := '{}';
BEGIN
    FOR i IN 1 .. n LOOP
        SELECT * INTO d FROM rl_consume(p, s, cost);
        got := got || d.source;
        ok := ok || d.allowed;
    END LOOP;
    RETURN QUERY SELECT g.source, g.allowed, count(*)
        FROM unnest(got, ok) AS g(source, allowed) GROUP BY 1, 2 ORDER BY 1, 2;
END
$$;
-- What Redis itself holds for the subject now (a peek asks Redis).
CREATE FUNCTION pg_temp.in_redis(p text, s text) RETURNS bigint LANGUAGE sql
AS $$ SELECT remaining FROM rl_peek(p, s, 1) $$;

--
-- The columns and their bounds.
--
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
VALUES ('al.tb', 1000, 1, '1 hour', 10, '10 s');
SELECT name, allowance, allowance_ttl FROM rl_policy WHERE name = 'al.tb';
-- No allowance by default; a slice is used for a second unless told otherwise.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('al.none', 10, 1, '1 s');
SELECT allowance, allowance_ttl FROM rl_policy WHERE name = 'al.none';
SELECT expect_error($$UPDATE rl_policy SET allowance = 0 WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 11 WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 5, allowance_ttl = '0 s' WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 5, allowance_ttl = '1.5 ms' WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 5, allowance_ttl = '1 hour 1 ms' WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 5, allowance_ttl = '1 mon' WHERE name = 'al.none'$$);
SELECT expect_error($$UPDATE rl_policy SET allowance = 5, allowance_ttl = NULL WHERE name = 'al.none'$$);
-- The sliding algorithms weigh each token by when it was counted: no allowances.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period, allowance) VALUES ('al.bad', 'sliding_window', 10, '1 min', 5)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_period, allowance) VALUES ('al.bad', 'sliding_log', 10, '1 min', 5)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, allowance) VALUES ('al.bad', 'concurrency', 10, '1 min', 5)$$);
-- An allowance does not change what the bucket's state means: the same version.
SELECT version AS v_before FROM rl_policy WHERE name = 'al.none' \gset
UPDATE rl_policy SET allowance = 5, allowance_ttl = '2 s' WHERE name = 'al.none';
SELECT version = :v_before AS same_version FROM rl_policy WHERE name = 'al.none';
-- rl_define sets both, and keeps them when left out.
SELECT name, allowance, allowance_ttl FROM rl_define('al.defined', 100, '1 minute', allowance => 20, allowance_ttl => '5 s');
SELECT name, allowance, allowance_ttl FROM rl_define('al.defined', 200, '1 minute');
-- A change to an algorithm without allowances drops it; a capacity below it is refused.
SELECT name, algorithm, allowance FROM rl_define('al.defined', 200, '1 minute', algorithm => 'sliding_window');
SELECT name, allowance FROM rl_define('al.defined', 200, '1 minute', allowance => 20);
SELECT expect_error($$SELECT rl_define('al.defined', 10, '1 minute')$$);

--
-- A token bucket: the first take asks Redis; a subject asked again takes a slice of what
-- it was granted lately and the cost (at most the allowance), and its next takes are
-- granted from it. remaining is Redis's when the slice was taken and what the slice holds.
--
SELECT allowed, remaining, source FROM rl_consume('al.tb', 'hot');
SELECT allowed, remaining, source FROM rl_consume('al.tb', 'hot');   -- a slice of 2
SELECT allowed, remaining, source FROM rl_consume('al.tb', 'hot');   -- from it
SELECT pg_temp.in_redis('al.tb', 'hot');                             -- 997: 1 + 2 taken
SELECT allowed, remaining, source FROM rl_consume('al.tb', 'hot');   -- spent: a slice of 4
SELECT pg_temp.in_redis('al.tb', 'hot');                             -- 993: 4 more
-- Slices grow to the allowance: 100 takes, a Redis call per slice of 10 at most.
SELECT * FROM pg_temp.takes('al.tb', 'hot', 100);
SELECT pg_temp.in_redis('al.tb', 'hot') AS in_redis;
-- Every token granted was taken from Redis first: granted + held here + in Redis = 1000.
SELECT tokens_granted, source_allowance > 80 AS mostly_sliced FROM rl_stats WHERE policy = 'al.tb';
-- After allowance_ttl the slice is not used any more: the next take gives what it held
-- back (in the same round trip as its own slice).
SET ratelimit.test_clock_ms = '1796083210000';
SELECT allowed, source FROM rl_consume('al.tb', 'hot');
SELECT allowed, source FROM rl_consume('al.tb', 'hot');
-- Nothing is lost or counted twice: Redis holds what was not granted nor sliced.
SELECT 1000 - tokens_granted - pg_temp.in_redis('al.tb', 'hot') AS held_here FROM rl_stats WHERE policy = 'al.tb';
-- A cold subject asks Redis each time: one take is no demand.
SELECT allowed, source FROM rl_consume('al.tb', 'cold');
SET ratelimit.test_clock_ms = '1796083230000';
SELECT allowed, source FROM rl_consume('al.tb', 'cold');

--
-- The last tokens: a slice takes what the bucket holds, never more; exactly the capacity
-- is granted.
--
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
VALUES ('al.small', 25, 1, '1 day', 8, '1 min');
SELECT * FROM pg_temp.takes('al.small', 'x', 40);
SELECT pg_temp.in_redis('al.small', 'x') AS in_redis;
-- A cost larger than the slice holds: what it holds goes back in the round trip that
-- takes a new slice (the demand and the cost, at most 50): Redis holds 38, this server 10.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
VALUES ('al.costs', 100, 1, '1 day', 50, '1 min');
SELECT * FROM pg_temp.takes('al.costs', 'x', 4, 3);
SELECT allowed, remaining, source FROM rl_consume('al.costs', 'x', 40);
SELECT 100 - tokens_granted - pg_temp.in_redis('al.costs', 'x') AS held_here FROM rl_stats WHERE policy = 'al.costs';
-- A cost above the allowance (no slice would be larger): Redis alone (which holds 38:
-- denied), the slice kept for the takes it can serve.
SELECT allowed, source FROM rl_consume('al.costs', 'x', 51);
SELECT allowed, source FROM rl_consume('al.costs', 'x', 1);

--
-- GCRA, the same.
--
INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, allowance, allowance_ttl)
VALUES ('al.gcra', 'gcra', 30, 1, '1 day', 6, '1 min');
SELECT * FROM pg_temp.takes('al.gcra', 'x', 50);
SELECT pg_temp.in_redis('al.gcra', 'x') AS in_redis;

--
-- A fixed window: a slice lives no longer than its window, and what it held is not
-- given to the next one.
--
SET ratelimit.test_clock_ms = '1796083200000';
INSERT INTO rl_policy (name, algorithm, capacity, refill_period, allowance, allowance_ttl)
VALUES ('al.fixed', 'fixed_window', 30, '1 minute', 10, '1 hour');
SELECT * FROM pg_temp.takes('al.fixed', 'x', 12);
SELECT pg_temp.in_redis('al.fixed', 'x') AS in_redis;          -- the slice took more
SET ratelimit.test_clock_ms = '1796083259999';
SELECT * FROM pg_temp.takes('al.fixed', 'x', 40);              -- 30 in this window
SET ratelimit.test_clock_ms = '1796083260000';
SELECT allowed, remaining, source FROM rl_consume('al.fixed', 'x');   -- a new window: Redis
SELECT * FROM pg_temp.takes('al.fixed', 'x', 40);              -- 29 more, not one over
SELECT pg_temp.in_redis('al.fixed', 'x') AS in_redis;

--
-- Every function that takes one subject: rl_enforce, rl_reserve (a rollback gives the
-- token back to Redis), rl_consume_many, rl_headers.
--
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
VALUES ('al.fns', 100, 1, '1 day', 10, '1 min');
SELECT * FROM pg_temp.takes('al.fns', 'x', 3);
SELECT allowed, source FROM rl_enforce('al.fns', 'x');
SELECT pg_temp.in_redis('al.fns', 'x') AS before_reserve \gset
BEGIN;
SELECT allowed, source FROM rl_reserve('al.fns', 'x');
ROLLBACK;
SELECT pg_temp.in_redis('al.fns', 'x') - :before_reserve AS given_back;
SELECT subject, allowed, source FROM rl_consume_many('al.fns', ARRAY['x', 'x', 'y']);
SELECT d.source, rl_headers(d) FROM rl_consume('al.fns', 'x') AS d;  -- a new slice
SELECT d.source, rl_headers(d) FROM rl_consume('al.fns', 'x') AS d;  -- from it: a bucket's headers too
-- rl_peek, rl_refund and rl_reset go to Redis as before.
SELECT allowed, source FROM rl_peek('al.fns', 'x');
SELECT allowed, source FROM rl_refund('al.fns', 'x', 1);
SELECT rl_reset('al.fns', 'x');
SELECT pg_temp.in_redis('al.fns', 'x') AS after_reset;
-- A reset here also drops this server's slice (its tokens came from the bucket now full
-- again): the next take asks Redis (for a slice of 10: the allowance), and granted (6),
-- held here (4) and left in Redis (90) add up to 100.
SELECT allowed, source FROM rl_consume('al.fns', 'x');
SELECT * FROM pg_temp.takes('al.fns', 'x', 5);
SELECT pg_temp.in_redis('al.fns', 'x') AS in_redis;

--
-- Fixed answers and shadow mode come first, as without an allowance.
--
UPDATE rl_policy SET mode = 'disabled' WHERE name = 'al.fns';
SELECT allowed, source FROM rl_consume('al.fns', 'x');
UPDATE rl_policy SET mode = 'enforce' WHERE name = 'al.fns';
INSERT INTO rl_override (policy, subject, action) VALUES ('al.fns', 'x', 'deny');
SELECT allowed, source FROM rl_consume('al.fns', 'x');
DELETE FROM rl_override WHERE policy = 'al.fns';

DELETE FROM rl_policy WHERE name LIKE 'al.%';
RESET ratelimit.test_clock_ms;
