-- rl_consume_all (several checks in one atomic step: all granted or none charged) and
-- rl_limit_trigger (a trigger that charges a policy for the rows written). The clock
-- does not move, so nothing refills and rl_peek (which takes nothing) shows every level.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2600000000000';
-- One token every 360 s (tenant, open, local), 720 s (user), 900 s (local2).
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('multi.tenant', 10, 10, '1 hour', 'closed'),
    ('multi.user', 5, 5, '1 hour', 'closed'),
    ('multi.big', 100, 100, '1 hour', 'closed'),
    ('multi.open', 10, 10, '1 hour', 'open'),
    ('multi.open2', 10, 10, '1 hour', 'open'),
    ('multi.local', 10, 10, '1 hour', 'local'),
    ('multi.local2', 4, 4, '1 hour', 'local');
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES
    ('multi.conc', 'concurrency', 3, '1 minute');

-- The level of a bucket, as rl_peek sees it (taking nothing).
CREATE FUNCTION pg_temp.level(p text, s text) RETURNS bigint
LANGUAGE sql AS $$ SELECT remaining FROM rl_peek(p, s) $$;

--
-- All granted: one decision per check, in the order of the checks.
--
SELECT ordinality AS n, allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/bob'], ARRAY[2, 1])
     WITH ORDINALITY;
-- costs left out (or NULL): 1 each.
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/carol']) WITH ORDINALITY;
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/carol'], NULL) WITH ORDINALITY;
-- These are the buckets rl_consume and rl_peek use for the same policy and subject.
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/bob') AS bob,
       pg_temp.level('multi.user', 'acme/carol') AS carol;
SELECT allowed, remaining FROM rl_consume('multi.user', 'acme/bob', 1);
-- One check alone is one ordinary decision.
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.user'], ARRAY['acme/bob'], ARRAY[2]) WITH ORDINALITY;
-- 32 checks at most, under one tag.
SELECT count(*) AS checks, bool_and(allowed) AS all_allowed, min(remaining), max(remaining)
FROM rl_consume_all(array_fill('multi.big'::text, ARRAY[32]),
                    ARRAY(SELECT 'wide/u' || i FROM generate_series(1, 32) AS i),
                    array_fill(3::bigint, ARRAY[32]));
SELECT pg_temp.level('multi.big', 'wide/u1') AS u1, pg_temp.level('multi.big', 'wide/u32') AS u32;

--
-- One bucket short: nothing is charged anywhere. Every check is denied; a check that
-- alone could pass says retry_after_ms 0, the short one says when it could.
--
SELECT allowed, remaining FROM rl_consume('multi.user', 'acme/dave', 5);
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant_before;
SELECT ordinality AS n, allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user', 'multi.user'],
                    ARRAY['acme', 'acme/bob', 'acme/dave'], ARRAY[3, 1, 1]) WITH ORDINALITY;
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/bob') AS bob,
       pg_temp.level('multi.user', 'acme/dave') AS dave;
-- The short bucket first: the same.
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.user', 'multi.tenant'], ARRAY['acme/dave', 'acme']) WITH ORDINALITY;
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/dave') AS dave;
-- Not empty, only short of the cost (8 asked, 6 left: two tokens in 720 s).
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.user', 'multi.tenant'], ARRAY['acme/carol', 'acme'], ARRAY[1, 8])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/carol') AS carol;
-- And what is there can still be taken, all together.
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.user', 'multi.tenant'], ARRAY['acme/carol', 'acme'], ARRAY[3, 5])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/carol') AS carol;

--
-- The same bucket named twice is charged twice: the costs add up.
--
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.user', 'multi.user'], ARRAY['acme/erin', 'acme/erin'], ARRAY[2, 3])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.user', 'acme/erin') AS erin;
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user', 'multi.tenant'], ARRAY['dup', 'dup/frank', 'dup'],
                    ARRAY[3, 1, 4]) WITH ORDINALITY;
SELECT pg_temp.level('multi.tenant', 'dup') AS tenant, pg_temp.level('multi.user', 'dup/frank') AS frank;
-- Each cost fits, their sum does not: Redis denies both and takes nothing.
SELECT allowed, remaining FROM rl_consume('multi.user', 'acme/gina', 1);
SELECT ordinality AS n, allowed, source
FROM rl_consume_all(ARRAY['multi.user', 'multi.user'], ARRAY['acme/gina', 'acme/gina'], ARRAY[2, 3])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.user', 'acme/gina') AS gina;
-- The same with a policy that fails open: still a denial by Redis, never a grant.
SELECT allowed, remaining FROM rl_consume('multi.open', 'acme/hal', 4);
SELECT ordinality AS n, allowed, source
FROM rl_consume_all(ARRAY['multi.open', 'multi.open'], ARRAY['acme/hal', 'acme/hal'], ARRAY[4, 4])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.open', 'acme/hal') AS hal;

--
-- Errors: nothing is charged by a call that fails.
--
-- Arrays of different lengths (costs included).
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY['acme', 'acme/bob'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY['acme'], ARRAY[1, 2])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY['acme'], '{}')$$);
-- 1 to 32 checks.
SELECT expect_error($$SELECT * FROM rl_consume_all('{}', '{}')$$);
SELECT expect_error($$SELECT * FROM rl_consume_all('{}', '{}', '{}')$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(array_fill('multi.big'::text, ARRAY[33]),
    ARRAY(SELECT 'wide/u' || i FROM generate_series(1, 33) AS i))$$);
-- NULL arrays and NULL elements.
SELECT expect_error($$SELECT * FROM rl_consume_all(NULL, ARRAY['acme'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], NULL)$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', NULL], ARRAY['acme', 'acme/bob'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', NULL])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/bob'], ARRAY[1, NULL])$$);
-- Unknown policy, concurrency policy, cost out of bounds, bad subject.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.nope'], ARRAY['acme', 'acme/bob'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.conc'], ARRAY['acme', 'acme/bob'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/bob'], ARRAY[1, 6])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/bob'], ARRAY[1, 0])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/bob'], ARRAY[-1, 1])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', ''])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY[repeat('x', 1025)])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY[['multi.tenant']], ARRAY[['acme']])$$);
-- None of them charged anything (1 token left in each before them).
SELECT pg_temp.level('multi.tenant', 'acme') AS tenant, pg_temp.level('multi.user', 'acme/bob') AS bob;

--
-- One hash tag: one Redis Cluster slot, so that one script can take every check.
-- "tag/rest" with a safe-id tag has the tag "tag"; any other subject is its own tag.
--
SELECT allowed, remaining FROM rl_consume('multi.tenant', 'globex', 1);
-- 'globex' and 'globex/bob' share the tag "globex".
SELECT ordinality AS n, allowed, remaining, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['globex', 'globex/bob']) WITH ORDINALITY;
-- Different tags are refused, whatever the policies.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.user', 'multi.user'], ARRAY['acme/bob', 'globex/bob'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.tenant'], ARRAY['acme', 'globex'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user', 'multi.user'], ARRAY['acme', 'acme/bob', 'globex/bob'])$$);
-- Checks are read in order: check 2's other tag is the error, not check 3's unknown policy.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.tenant', 'multi.nope'], ARRAY['acme', 'globex', 'acme/x'])$$);
-- The whole error, as a client sees it.
SELECT * FROM rl_consume_all(ARRAY['multi.user', 'multi.user'], ARRAY['acme/bob', 'globex/bob']);
-- Case matters: "Acme" is another tag.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'Acme/bob'])$$);
-- A rest that is not a safe id keeps the tag (the rest is hashed in the key).
SELECT ordinality AS n, allowed, remaining, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['globex', 'globex/bob@example.com'])
     WITH ORDINALITY;
-- A tag that is not a safe id: the whole subject is the tag (hashed), so 'a b/c' and
-- 'a b/d' do not share one, nor do 'a b' and 'a b/c'.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.user', 'multi.user'], ARRAY['a b/c', 'a b/d'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['a b', 'a b/c'])$$);
SELECT ordinality AS n, allowed, remaining, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['a b/c', 'a b/c']) WITH ORDINALITY;
-- No tag before the "/": the whole subject again.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['bob', '/bob'])$$);
-- A 65-byte "tag" is not a safe id either.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY[repeat('t', 65), repeat('t', 65) || '/bob'])$$);
SELECT ordinality AS n, allowed, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY[repeat('t', 64), repeat('t', 64) || '/bob'])
     WITH ORDINALITY;
-- "tag/rest" is a bucket of its own, not the tag's.
SELECT pg_temp.level('multi.user', 'globex') AS globex_user, pg_temp.level('multi.user', 'globex/bob') AS globex_bob;

--
-- Redis cannot answer: the fail modes decide, still all or nothing.
--
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
-- Open and open: allowed.
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.open', 'multi.open2'], ARRAY['acme', 'acme/bob']) WITH ORDINALITY;
-- Open and closed (either order): the closed one denies the whole group.
SELECT ordinality AS n, allowed, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume_all(ARRAY['multi.open', 'multi.tenant'], ARRAY['acme', 'acme/bob']) WITH ORDINALITY;
SELECT ordinality AS n, allowed, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.open'], ARRAY['acme', 'acme/bob']) WITH ORDINALITY;
-- Local and local: both local buckets are charged.
SELECT ordinality AS n, allowed, remaining, retry_after_ms, reset_after_ms, policy, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.local2'], ARRAY['loc', 'loc/a'], ARRAY[4, 3])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.local', 'loc') AS local, pg_temp.level('multi.local2', 'loc/a') AS local2;
-- Again: multi.local takes 4 (6 left), then multi.local2 is short (1 left, 3 asked),
-- so multi.local gets its 4 back and the group is denied. The short one says when
-- (2 tokens, 900 s each).
SELECT ordinality AS n, allowed, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.local2'], ARRAY['loc', 'loc/a'], ARRAY[4, 3])
     WITH ORDINALITY;
SELECT allowed, remaining, retry_after_ms, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.local2'], ARRAY['loc', 'loc/a'], ARRAY[4, 3])
WHERE policy = 'multi.local2';
SELECT allowed, remaining, source FROM rl_peek('multi.local', 'loc');
SELECT allowed, remaining, source FROM rl_peek('multi.local2', 'loc/a');
-- The short one first: nothing taken either.
SELECT ordinality AS n, allowed, policy, source
FROM rl_consume_all(ARRAY['multi.local2', 'multi.local'], ARRAY['loc/a', 'loc'], ARRAY[3, 4])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.local', 'loc') AS local, pg_temp.level('multi.local2', 'loc/a') AS local2;
-- The same bucket twice: 4 + 4 with 6 left is short, and the first 4 come back.
SELECT ordinality AS n, allowed, policy, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.local'], ARRAY['loc', 'loc'], ARRAY[4, 4])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.local', 'loc') AS local;
-- Local and open: allowed, the local bucket charged.
SELECT ordinality AS n, allowed, remaining, policy, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.open'], ARRAY['loc', 'loc/b'], ARRAY[2, 1])
     WITH ORDINALITY;
-- Local and closed: denied, and the local bucket keeps its tokens.
SELECT ordinality AS n, allowed, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.tenant'], ARRAY['loc', 'loc/b'], ARRAY[2, 1])
     WITH ORDINALITY;
SELECT pg_temp.level('multi.local', 'loc') AS local;
-- Bad input is still an error, not a fail-mode decision.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.open', 'multi.open'], ARRAY['acme', 'globex'])$$);
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.open', 'multi.open'], ARRAY['acme', 'acme/bob'], ARRAY[1, 11])$$);
RESET ratelimit.redis_url;
-- Redis decides again, and its buckets were never touched by the local decisions.
SELECT ordinality AS n, allowed, remaining, source
FROM rl_consume_all(ARRAY['multi.local', 'multi.local2'], ARRAY['loc', 'loc/a']) WITH ORDINALITY;

--
-- rl_limit_trigger, row level: one token per row for the row's subject.
--
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('trig.row', 3, 3, '1 hour', 'closed'),
    ('trig.upd', 3, 3, '1 hour', 'closed'),
    ('trig.cost', 10, 10, '1 hour', 'closed'),
    ('trig.stmt', 5, 5, '1 hour', 'closed'),
    ('trig.open', 3, 3, '1 hour', 'open'),
    ('trig.local', 3, 3, '1 hour', 'local');

CREATE TABLE trig_comments (id serial PRIMARY KEY, tenant text, body text);
CREATE TRIGGER trig_comments_limit BEFORE INSERT ON trig_comments
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
INSERT INTO trig_comments (tenant, body) VALUES ('t1', 'one');
INSERT INTO trig_comments (tenant, body) VALUES ('t1', 'two');
INSERT INTO trig_comments (tenant, body) VALUES ('t1', 'three');
-- The fourth row is over the limit: rl_enforce's error (one token every 1200 s).
INSERT INTO trig_comments (tenant, body) VALUES ('t1', 'four');
\echo :LAST_ERROR_SQLSTATE
SELECT tenant, count(*) FROM trig_comments GROUP BY 1 ORDER BY 1;
-- Another subject has its own bucket.
INSERT INTO trig_comments (tenant, body) VALUES ('t2', 'one') RETURNING tenant, body;
SELECT pg_temp.level('trig.row', 't1') AS t1, pg_temp.level('trig.row', 't2') AS t2;
-- A statement of several rows that goes over: the rows before were charged, and the
-- failed statement gives them all back.
INSERT INTO trig_comments (tenant) VALUES ('t3'), ('t3'), ('t3'), ('t3');
SELECT pg_temp.level('trig.row', 't3') AS t3, count(*) AS t3_rows FROM trig_comments WHERE tenant = 't3';
INSERT INTO trig_comments (tenant) VALUES ('t2'), ('t2'), ('t2');
SELECT pg_temp.level('trig.row', 't2') AS t2, count(*) AS t2_rows FROM trig_comments WHERE tenant = 't2';
-- Rows of several subjects: each is charged; a denial refunds every one of them.
INSERT INTO trig_comments (tenant) VALUES ('t4'), ('t5'), ('t4'), ('t2');
SELECT pg_temp.level('trig.row', 't4') AS t4, pg_temp.level('trig.row', 't5') AS t5;
INSERT INTO trig_comments (tenant) VALUES ('t4'), ('t5'), ('t4');
SELECT pg_temp.level('trig.row', 't4') AS t4, pg_temp.level('trig.row', 't5') AS t5;
-- A statement that fails for another reason after the trigger ran: refunded too.
INSERT INTO trig_comments (id, tenant) VALUES (1000, 't6'), (1000, 't6');
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.row', 't6') AS t6;
-- Inside a transaction: a ROLLBACK, or a ROLLBACK TO SAVEPOINT, refunds; COMMIT keeps.
BEGIN;
INSERT INTO trig_comments (tenant) VALUES ('t7'), ('t7');
SELECT pg_temp.level('trig.row', 't7') AS t7_inside;
ROLLBACK;
SELECT pg_temp.level('trig.row', 't7') AS t7_after_rollback;
BEGIN;
INSERT INTO trig_comments (tenant) VALUES ('t7');
SAVEPOINT a;
INSERT INTO trig_comments (tenant) VALUES ('t7');
ROLLBACK TO SAVEPOINT a;
SAVEPOINT b;
-- Over the limit inside a savepoint: only this statement's charges come back.
INSERT INTO trig_comments (tenant) VALUES ('t7'), ('t7'), ('t7');
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.level('trig.row', 't7') AS t7_inside;
COMMIT;
SELECT pg_temp.level('trig.row', 't7') AS t7_after_commit, count(*) AS t7_rows
FROM trig_comments WHERE tenant = 't7';
-- The subject is the column's value as text: an integer column works too.
CREATE TABLE trig_orders (id serial, customer_id integer, note text);
CREATE TRIGGER trig_orders_limit BEFORE INSERT ON trig_orders
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'customer_id');
INSERT INTO trig_orders (customer_id) VALUES (42), (42);
SELECT pg_temp.level('trig.row', '42') AS customer_42;
-- An AFTER ROW trigger charges the same way.
CREATE TABLE trig_after (tenant text);
CREATE TRIGGER trig_after_limit AFTER INSERT ON trig_after
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
INSERT INTO trig_after VALUES ('ta'), ('ta'), ('ta');
INSERT INTO trig_after VALUES ('ta');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS ta_rows, pg_temp.level('trig.row', 'ta') AS ta FROM trig_after;

--
-- UPDATE: each row updated is charged, for the subject of its new version.
--
CREATE TABLE trig_docs (id int PRIMARY KEY, owner text, pages int);
INSERT INTO trig_docs SELECT i, 'o1', 0 FROM generate_series(1, 5) AS i;
CREATE TRIGGER trig_docs_limit BEFORE UPDATE ON trig_docs
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.upd', 'owner');
-- The INSERT above was not charged.
SELECT pg_temp.level('trig.upd', 'o1') AS o1;
UPDATE trig_docs SET pages = 1 WHERE id <= 2;
SELECT pg_temp.level('trig.upd', 'o1') AS o1;
-- Two more rows with one token left: the statement fails and nothing changes.
UPDATE trig_docs SET pages = 2 WHERE id IN (3, 4);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.upd', 'o1') AS o1;
SELECT id, owner, pages FROM trig_docs ORDER BY id;
-- A row moved to another owner is that owner's charge.
UPDATE trig_docs SET owner = 'o2', pages = 3 WHERE id = 5;
SELECT pg_temp.level('trig.upd', 'o1') AS o1, pg_temp.level('trig.upd', 'o2') AS o2;
-- INSERT OR UPDATE in one trigger.
CREATE TABLE trig_both (id int PRIMARY KEY, owner text);
CREATE TRIGGER trig_both_limit BEFORE INSERT OR UPDATE ON trig_both
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.upd', 'owner');
INSERT INTO trig_both VALUES (1, 'o3'), (2, 'o3');
UPDATE trig_both SET id = id + 10 WHERE id = 1;
UPDATE trig_both SET id = id + 10 WHERE id = 2;
\echo :LAST_ERROR_SQLSTATE
SELECT id, owner FROM trig_both ORDER BY id;
SELECT pg_temp.level('trig.upd', 'o3') AS o3;

--
-- A cost column: each row costs its value (smallint, integer or bigint).
--
CREATE TABLE trig_exports (id serial, tenant_id int, rows_requested int, pages smallint, bytes bigint,
                           price numeric);
CREATE TRIGGER trig_exports_limit BEFORE INSERT ON trig_exports
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.cost', 'tenant_id', 'rows_requested');
INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (1, 4);
SELECT pg_temp.level('trig.cost', '1') AS tenant_1;
INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (1, 5), (1, 2);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.cost', '1') AS tenant_1;
INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (1, 5), (1, 1);
SELECT pg_temp.level('trig.cost', '1') AS tenant_1;
-- One row above the capacity can never pass: RL429 at once.
INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (2, 11);
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.cost', '2') AS tenant_2;
-- A cost of 0 or less is bad input; NULL is never "free".
SELECT expect_error($$INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (2, 0)$$);
SELECT expect_error($$INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (2, -3)$$);
SELECT expect_error($$INSERT INTO trig_exports (tenant_id, rows_requested) VALUES (2, NULL)$$);
DROP TRIGGER trig_exports_limit ON trig_exports;
CREATE TRIGGER trig_exports_limit BEFORE INSERT ON trig_exports
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.cost', 'tenant_id', 'pages');
INSERT INTO trig_exports (tenant_id, pages) VALUES (3, 2);
DROP TRIGGER trig_exports_limit ON trig_exports;
CREATE TRIGGER trig_exports_limit BEFORE INSERT ON trig_exports
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.cost', 'tenant_id', 'bytes');
INSERT INTO trig_exports (tenant_id, bytes) VALUES (3, 3);
SELECT pg_temp.level('trig.cost', '3') AS tenant_3;
-- A cost column that is not an integer: 42804.
DROP TRIGGER trig_exports_limit ON trig_exports;
CREATE TRIGGER trig_exports_limit BEFORE INSERT ON trig_exports
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.cost', 'tenant_id', 'price');
SELECT expect_error($$INSERT INTO trig_exports (tenant_id, price) VALUES (3, 1)$$);
DROP TRIGGER trig_exports_limit ON trig_exports;
SELECT pg_temp.level('trig.cost', '3') AS tenant_3;

--
-- Statement level (AFTER ... REFERENCING NEW TABLE ... FOR EACH STATEMENT): one charge
-- per subject, for its number of rows (or the sum of its costs).
--
CREATE TABLE trig_events (tenant text, n int);
CREATE TRIGGER trig_events_limit AFTER INSERT ON trig_events
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.stmt', 'tenant');
-- INSERT ... SELECT within budget: s1 three rows, s2 two.
INSERT INTO trig_events SELECT CASE WHEN i <= 3 THEN 's1' ELSE 's2' END, i FROM generate_series(1, 5) AS i;
SELECT pg_temp.level('trig.stmt', 's1') AS s1, pg_temp.level('trig.stmt', 's2') AS s2;
-- Over budget: s1 has 2 left and 4 rows come. One charge of 4 is denied: the DETAIL
-- gives the time for the 2 missing tokens (1440 s), not for one row's token.
INSERT INTO trig_events SELECT 's1', i FROM generate_series(1, 4) AS i;
\echo :LAST_ERROR_SQLSTATE
-- Several subjects, one over: the others' charges come back, no row stays.
INSERT INTO trig_events SELECT CASE WHEN i <= 2 THEN 's3' WHEN i <= 5 THEN 's1' ELSE 's2' END, i
FROM generate_series(1, 6) AS i;
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.stmt', 's1') AS s1, pg_temp.level('trig.stmt', 's2') AS s2,
       pg_temp.level('trig.stmt', 's3') AS s3;
SELECT tenant, count(*) FROM trig_events GROUP BY 1 ORDER BY 1;
-- A subject's total above the capacity: RL429 at once.
INSERT INTO trig_events SELECT 's4', i FROM generate_series(1, 6) AS i;
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.stmt', 's4') AS s4;
-- Nothing inserted: nothing charged.
INSERT INTO trig_events SELECT 's5', 1 WHERE false;
-- COPY within budget: c1 three rows, c2 one.
COPY trig_events FROM STDIN;
c1	1
c2	2
c1	3
c1	4
\.
SELECT pg_temp.level('trig.stmt', 'c1') AS c1, pg_temp.level('trig.stmt', 'c2') AS c2;
-- COPY above budget: c1 has 2 left and 3 rows come; c2's charge comes back too.
COPY trig_events FROM STDIN;
c2	5
c1	6
c1	7
c1	8
\.
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('trig.stmt', 'c1') AS c1, pg_temp.level('trig.stmt', 'c2') AS c2;
SELECT tenant, count(*) FROM trig_events WHERE tenant LIKE 'c%' GROUP BY 1 ORDER BY 1;
-- Rolled back: refunded.
BEGIN;
INSERT INTO trig_events VALUES ('s5', 1), ('s5', 2);
SELECT pg_temp.level('trig.stmt', 's5') AS s5_inside;
ROLLBACK;
SELECT pg_temp.level('trig.stmt', 's5') AS s5_after_rollback;
-- NULL or empty subjects are refused, and nothing is charged for the others.
SELECT expect_error($$INSERT INTO trig_events VALUES ('s5', 1), (NULL, 2)$$);
SELECT expect_error($$INSERT INTO trig_events VALUES ('s5', 1), ('', 2)$$);
SELECT pg_temp.level('trig.stmt', 's5') AS s5;
-- With a cost column: the sum of the costs per subject.
CREATE TABLE trig_batches (tenant text, items int);
CREATE TRIGGER trig_batches_limit AFTER INSERT ON trig_batches
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.stmt', 'tenant', 'items');
COPY trig_batches FROM STDIN;
b1	2
b2	1
b1	1
\.
SELECT pg_temp.level('trig.stmt', 'b1') AS b1, pg_temp.level('trig.stmt', 'b2') AS b2;
INSERT INTO trig_batches VALUES ('b1', 1), ('b1', 2);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO trig_batches VALUES ('b2', 3), ('b2', 3);
\echo :LAST_ERROR_SQLSTATE
SELECT expect_error($$INSERT INTO trig_batches VALUES ('b2', 1), ('b2', NULL)$$);
SELECT expect_error($$INSERT INTO trig_batches VALUES ('b2', 1), ('b2', 0)$$);
SELECT pg_temp.level('trig.stmt', 'b1') AS b1, pg_temp.level('trig.stmt', 'b2') AS b2;
SELECT tenant, sum(items) FROM trig_batches GROUP BY 1 ORDER BY 1;
-- UPDATE with REFERENCING NEW TABLE: the new rows are charged.
CREATE TABLE trig_moves (id int, tenant text);
INSERT INTO trig_moves SELECT i, 'm0' FROM generate_series(1, 4) AS i;
CREATE TRIGGER trig_moves_limit AFTER UPDATE ON trig_moves
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.stmt', 'tenant');
UPDATE trig_moves SET tenant = 'm1' WHERE id <= 3;
SELECT pg_temp.level('trig.stmt', 'm0') AS m0, pg_temp.level('trig.stmt', 'm1') AS m1;

--
-- Redis cannot answer: the policy's fail mode decides for the trigger too.
--
CREATE TABLE trig_down (tenant text);
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
-- 'closed': RL503, and no row.
CREATE TRIGGER trig_down_limit BEFORE INSERT ON trig_down
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$INSERT INTO trig_down VALUES ('d1')$$);
DROP TRIGGER trig_down_limit ON trig_down;
-- 'open': every row passes.
CREATE TRIGGER trig_down_limit BEFORE INSERT ON trig_down
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.open', 'tenant');
INSERT INTO trig_down VALUES ('d1'), ('d1'), ('d1'), ('d1');
DROP TRIGGER trig_down_limit ON trig_down;
-- 'local': the local bucket; a failed statement gives its local tokens back.
CREATE TRIGGER trig_down_limit BEFORE INSERT ON trig_down
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.local', 'tenant');
INSERT INTO trig_down VALUES ('d2'), ('d2'), ('d2'), ('d2');
\echo :LAST_ERROR_SQLSTATE
SELECT allowed, remaining, source FROM rl_peek('trig.local', 'd2');
INSERT INTO trig_down VALUES ('d2'), ('d2');
SELECT allowed, remaining, source FROM rl_peek('trig.local', 'd2');
DROP TRIGGER trig_down_limit ON trig_down;
RESET ratelimit.redis_url;
SELECT tenant, count(*) FROM trig_down GROUP BY 1 ORDER BY 1;
SELECT pg_temp.level('trig.local', 'd2') AS d2_in_redis;

--
-- Trigger errors.
--
CREATE TABLE trig_errors (id int, tenant text, cost int);
INSERT INTO trig_errors VALUES (1, 'e1', 1);
-- Bad column names: 42703.
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'nope');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant', 'nope');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- A NULL subject: 22004.
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, NULL, 1)$$);
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, '', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- An unknown policy: 42704.
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.nope', 'tenant');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- A concurrency policy: 42809.
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('multi.conc', 'tenant');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- Wrong number of arguments: 22023.
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger();
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant', 'cost', 'extra');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- DELETE, at row or statement level: 39P01.
CREATE TRIGGER trig_errors_limit BEFORE DELETE ON trig_errors
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$DELETE FROM trig_errors$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
CREATE TRIGGER trig_errors_limit AFTER DELETE ON trig_errors
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$DELETE FROM trig_errors$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- Statement level without the new rows (no transition table, or BEFORE): 39P01.
CREATE TRIGGER trig_errors_limit AFTER INSERT ON trig_errors
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
CREATE TRIGGER trig_errors_limit BEFORE INSERT ON trig_errors
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
SELECT expect_error($$INSERT INTO trig_errors VALUES (2, 'e1', 1)$$);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- The whole error, as a client sees it.
CREATE TRIGGER trig_errors_limit AFTER INSERT ON trig_errors
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
INSERT INTO trig_errors VALUES (2, 'e1', 1);
DROP TRIGGER trig_errors_limit ON trig_errors;
-- Not as a trigger.
SELECT expect_error($$SELECT rl_limit_trigger()$$);
-- Nothing was inserted, nothing charged.
SELECT count(*) AS rows FROM trig_errors;
SELECT pg_temp.level('trig.row', 'e1') AS e1;

--
-- Privileges: neither function is executable without a grant, and a table owner
-- without one cannot attach the trigger.
--
SELECT proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
FROM pg_proc p
WHERE proname IN ('rl_consume_all', 'rl_limit_trigger')
ORDER BY 1;
CREATE ROLE regress_multi_app;
CREATE TABLE trig_owned (tenant text);
ALTER TABLE trig_owned OWNER TO regress_multi_app;
SET ROLE regress_multi_app;
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY['acme'])$$);
SELECT expect_error($$CREATE TRIGGER trig_owned_limit BEFORE INSERT ON trig_owned FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION rl_limit_trigger() TO regress_multi_app;
SET ROLE regress_multi_app;
CREATE TRIGGER trig_owned_limit BEFORE INSERT ON trig_owned
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.row', 'tenant');
INSERT INTO trig_owned VALUES ('own');
-- A grant of the trigger is not a grant of rl_consume_all.
SELECT expect_error($$SELECT * FROM rl_consume_all(ARRAY['multi.tenant'], ARRAY['acme'])$$);
RESET ROLE;
SELECT pg_temp.level('trig.row', 'own') AS own;
DROP TABLE trig_owned;
REVOKE ALL ON FUNCTION rl_limit_trigger() FROM regress_multi_app;
DROP ROLE regress_multi_app;

DROP TABLE trig_comments, trig_orders, trig_after, trig_docs, trig_both, trig_exports, trig_events,
    trig_batches, trig_moves, trig_down, trig_errors;
DELETE FROM rl_policy WHERE name LIKE 'multi.%' OR name LIKE 'trig.%';
RESET ratelimit.test_clock_ms;
