-- Concurrency leases: rl_acquire takes one lease (given back when its transaction ends,
-- or with scope 'session' when the session ends), rl_release gives one back early,
-- rl_peek counts the free ones, and a lease nobody gives back expires after idle_ttl.
-- The clock only moves when this script moves it, so every expiry is exact.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2600000000000';
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, fail_mode) VALUES
    ('lease.basic', 'concurrency', 2, '1 min', 'closed'),
    ('lease.tx', 'concurrency', 3, '1 min', 'closed'),
    ('lease.ttl', 'concurrency', 1, '10 s', 'closed'),
    ('lease.open', 'concurrency', 1, '1 min', 'open'),
    ('lease.local', 'concurrency', 1, '1 min', 'local');
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES
    ('lease.bucket', 10, 10, '1 hour');
SELECT name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode
FROM rl_policy WHERE name LIKE 'lease.%' ORDER BY name;

-- The free leases of a subject, as rl_peek sees them (taking none).
CREATE FUNCTION pg_temp.free(p text, s text) RETURNS bigint
LANGUAGE sql AS $$ SELECT remaining FROM rl_peek(p, s) $$;

--
-- Up to capacity, then denied until the soonest lease expires.
--
-- A subject never used has every lease free.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('lease.basic', 'cap_s');
BEGIN;
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_acquire('lease.basic', 'cap_s');
-- One second later, the second and last lease: every lease held is gone in 60 s.
SET ratelimit.test_clock_ms = '2600000001000';
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_acquire('lease.basic', 'cap_s');
-- Four seconds later: denied; the first lease expires in 60 - 5 = 55 s, the last in 56 s.
SET ratelimit.test_clock_ms = '2600000005000';
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_acquire('lease.basic', 'cap_s');
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source
FROM rl_acquire('lease.basic', 'cap_s', 'session');
-- rl_peek makes the same decision, taking nothing.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('lease.basic', 'cap_s');
-- Another subject, another policy: their own leases.
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'cap_other');
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'cap_s');
COMMIT;

--
-- The end of the transaction gives its leases back: commit or rollback.
--
-- The commit above released all four leases it held (the denied ones were never held).
SELECT pg_temp.free('lease.basic', 'cap_s') AS basic_cap_s, pg_temp.free('lease.basic', 'cap_other') AS basic_cap_other,
       pg_temp.free('lease.tx', 'cap_s') AS tx_cap_s;
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('lease.basic', 'cap_s');

BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'rb_s');
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'rb_s', 'transaction');
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'rb_s');
SELECT pg_temp.free('lease.basic', 'rb_s') AS free_inside;
ROLLBACK;
SELECT pg_temp.free('lease.basic', 'rb_s') AS free_after_rollback;

-- Outside a transaction block, a lease lasts as long as its statement.
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'stmt_s');
SELECT pg_temp.free('lease.basic', 'stmt_s') AS free_after_statement;
-- Both leases taken in one statement (the third call is denied), then both given back.
-- (OFFSET 0 keeps the planner from calling rl_acquire once per column.)
SELECT i, (d).allowed, (d).remaining
FROM (SELECT i, rl_acquire('lease.basic', 'stmt_s') AS d FROM generate_series(1, 3) AS i OFFSET 0) AS s
ORDER BY i;
SELECT pg_temp.free('lease.basic', 'stmt_s') AS free_after_statement;
-- A statement that fails after taking a lease gives it back.
DO $$
BEGIN
    PERFORM rl_acquire('lease.basic', 'stmt_s');
    RAISE NOTICE 'free inside: %', pg_temp.free('lease.basic', 'stmt_s');
    RAISE EXCEPTION 'the statement fails';
END
$$;
SELECT pg_temp.free('lease.basic', 'stmt_s') AS free_after_failed_statement;
-- An error inside a transaction block gives the leases back at once.
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'err_s');
SELECT 1 / 0;
ROLLBACK;
SELECT pg_temp.free('lease.basic', 'err_s') AS free_after_error;
-- A COMMIT that fails (a deferred constraint) rolls back: given back.
CREATE TABLE lease_deferred (id int UNIQUE DEFERRABLE INITIALLY DEFERRED);
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'deferred_s');
INSERT INTO lease_deferred VALUES (1), (1);
COMMIT;
SELECT pg_temp.free('lease.basic', 'deferred_s') AS free_after_failed_commit;
DROP TABLE lease_deferred;

--
-- Savepoints: ROLLBACK TO gives back only the leases taken since the savepoint;
-- RELEASE hands them to the enclosing transaction.
--
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
SAVEPOINT a;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
SAVEPOINT b;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
-- Undoes b only: 1 back.
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_rollback_to_b;
-- Rolling back to b again finds nothing more of b's.
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_second_rollback_to_b;
-- A lease taken in b after it was rolled back to, then a rollback to a: both of a's back.
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
ROLLBACK TO SAVEPOINT a;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_rollback_to_a;
-- A savepoint released: its lease now belongs to the transaction.
SAVEPOINT c;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sp_s');
RELEASE SAVEPOINT c;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_release_c;
-- ...so a rollback to an earlier savepoint does not touch it.
SAVEPOINT d;
ROLLBACK TO SAVEPOINT d;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_rollback_to_d;
COMMIT;
SELECT pg_temp.free('lease.tx', 'sp_s') AS free_after_commit;

-- RELEASE of an inner savepoint hands its lease to the outer one; ROLLBACK TO the outer
-- one gives it back.
BEGIN;
SAVEPOINT a;
SAVEPOINT b;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel_s');
RELEASE SAVEPOINT b;
SELECT pg_temp.free('lease.tx', 'rel_s') AS free_after_release_b;
ROLLBACK TO SAVEPOINT a;
SELECT pg_temp.free('lease.tx', 'rel_s') AS free_after_rollback_to_a;
-- Released savepoints, then a rollback of the whole transaction: all given back.
SAVEPOINT c;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel_s');
SAVEPOINT d;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel_s');
RELEASE SAVEPOINT d;
RELEASE SAVEPOINT c;
SELECT pg_temp.free('lease.tx', 'rel_s') AS free_after_releases;
ROLLBACK;
SELECT pg_temp.free('lease.tx', 'rel_s') AS free_after_rollback;

-- PL/pgSQL: an EXCEPTION block that catches an error gives back the leases taken inside
-- it; a block that ends normally hands its leases to the enclosing transaction.
BEGIN;
DO $$
BEGIN
    PERFORM rl_acquire('lease.tx', 'exc_s');
    BEGIN
        PERFORM rl_acquire('lease.tx', 'exc_s');
        PERFORM rl_acquire('lease.tx', 'exc_s');
        RAISE NOTICE 'inside the block: % free', pg_temp.free('lease.tx', 'exc_s');
        PERFORM 1 / (SELECT 0);
    EXCEPTION WHEN division_by_zero THEN
        RAISE NOTICE 'caught: % free', pg_temp.free('lease.tx', 'exc_s');
    END;
    BEGIN
        PERFORM rl_acquire('lease.tx', 'exc_s');
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'not reached';
    END;
    RAISE NOTICE 'at the end: % free', pg_temp.free('lease.tx', 'exc_s');
END
$$;
SELECT pg_temp.free('lease.tx', 'exc_s') AS free_after_block;
COMMIT;
SELECT pg_temp.free('lease.tx', 'exc_s') AS free_after_commit;

--
-- Scope 'session': the lease outlives its transaction (commit, rollback or savepoint
-- rollback alike, as a session-level advisory lock does) until rl_release or the end
-- of the session.
--
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sess_s', 'session');
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sess_s');
COMMIT;
SELECT pg_temp.free('lease.tx', 'sess_s') AS free_after_commit;
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sess_s', 'session');
ROLLBACK;
SELECT pg_temp.free('lease.tx', 'sess_s') AS free_after_rollback;
BEGIN;
SAVEPOINT a;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'sess_s', 'session');
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT pg_temp.free('lease.tx', 'sess_s') AS free_after_savepoint_rollback;
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.tx', 'sess_s', 'session');
-- rl_release gives them back one by one; then there is nothing left to give back.
SELECT rl_release('lease.tx', 'sess_s') AS released, pg_temp.free('lease.tx', 'sess_s') AS free;
SELECT rl_release('lease.tx', 'sess_s') AS released, pg_temp.free('lease.tx', 'sess_s') AS free;
SELECT rl_release('lease.tx', 'sess_s') AS released, pg_temp.free('lease.tx', 'sess_s') AS free;
SELECT rl_release('lease.tx', 'sess_s') AS released, pg_temp.free('lease.tx', 'sess_s') AS free;

--
-- rl_release: gives back the latest lease this session holds for the policy and subject.
--
SET ratelimit.test_clock_ms = '2600000010000';
SELECT allowed, remaining, reset_after_ms FROM rl_acquire('lease.tx', 'rel1_s', 'session');
SET ratelimit.test_clock_ms = '2600000020000';
BEGIN;
SELECT allowed, remaining, reset_after_ms FROM rl_acquire('lease.tx', 'rel1_s');
-- The latest (the transaction's, expiring at 80 s) goes back: the session's, expiring
-- at 70 s, is the one left (reset in 50 s).
SELECT rl_release('lease.tx', 'rel1_s');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('lease.tx', 'rel1_s');
-- A release is not undone by a rollback, and the rollback has no lease of its own left.
ROLLBACK;
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('lease.tx', 'rel1_s');
-- Another subject, or another policy: nothing held there, nothing given back.
SELECT rl_release('lease.tx', 'rel2_s') AS other_subject, rl_release('lease.basic', 'rel1_s') AS other_policy;
SELECT pg_temp.free('lease.tx', 'rel1_s') AS free;
SELECT rl_release('lease.tx', 'rel1_s') AS released, pg_temp.free('lease.tx', 'rel1_s') AS free;
-- A transaction lease given back early: the commit has nothing more to give back, and a
-- later lease of the same transaction is its own.
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel3_s');
SELECT rl_release('lease.tx', 'rel3_s') AS released, pg_temp.free('lease.tx', 'rel3_s') AS free;
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel3_s');
SELECT allowed, remaining FROM rl_acquire('lease.tx', 'rel3_s');
SELECT rl_release('lease.tx', 'rel3_s') AS released, pg_temp.free('lease.tx', 'rel3_s') AS free;
COMMIT;
SELECT pg_temp.free('lease.tx', 'rel3_s') AS free_after_commit;

--
-- rl_peek counts leases without taking one.
--
SELECT count(*) AS peeks, bool_and((d).allowed) AS all_allowed, min((d).remaining), max((d).remaining)
FROM (SELECT rl_peek('lease.basic', 'peek_s') AS d FROM generate_series(1, 20) OFFSET 0) AS s;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'peek_s', 'session');
SELECT count(*) AS peeks, bool_and((d).allowed) AS all_allowed, min((d).remaining), max((d).remaining)
FROM (SELECT rl_peek('lease.basic', 'peek_s') AS d FROM generate_series(1, 20) OFFSET 0) AS s;
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('lease.basic', 'peek_s', 1);
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'peek_s', 'session');
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('lease.basic', 'peek_s');
SELECT rl_release('lease.basic', 'peek_s'), rl_release('lease.basic', 'peek_s');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('lease.basic', 'peek_s');

--
-- A lease nobody gives back expires idle_ttl after it was taken (10 s here).
--
SET ratelimit.test_clock_ms = '2600000100000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_s', 'session');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_s');
-- 1 ms before it expires: still held.
SET ratelimit.test_clock_ms = '2600000109999';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_s');
-- At idle_ttl it is gone, though this session never gave it back: a new lease is granted.
SET ratelimit.test_clock_ms = '2600000110000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('lease.ttl', 'ttl_s');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_s', 'session');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_s', 'session');
-- The new lease goes back (true); the expired one can no longer be given back (false).
SELECT rl_release('lease.ttl', 'ttl_s') AS new_lease;
SELECT rl_release('lease.ttl', 'ttl_s') AS expired_lease;
SELECT pg_temp.free('lease.ttl', 'ttl_s') AS free;
-- A transaction that outlives idle_ttl loses its lease to the next caller; its commit
-- gives back only what it still holds.
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.ttl', 'ttl_tx');
SET ratelimit.test_clock_ms = '2600000125000';
SELECT allowed, remaining, reset_after_ms FROM rl_acquire('lease.ttl', 'ttl_tx');
SELECT allowed, remaining, retry_after_ms FROM rl_acquire('lease.ttl', 'ttl_tx');
COMMIT;
SELECT pg_temp.free('lease.ttl', 'ttl_tx') AS free_after_commit;

--
-- Errors: token-bucket functions refuse concurrency policies and the reverse (42809),
-- a scope is 'transaction' or 'session' (22023), NULLs are 22004.
--
SELECT expect_error($$SELECT rl_consume('lease.basic', 'err_s')$$);
SELECT expect_error($$SELECT rl_enforce('lease.basic', 'err_s')$$);
SELECT expect_error($$SELECT rl_reserve('lease.basic', 'err_s')$$);
SELECT expect_error($$SELECT rl_refund('lease.basic', 'err_s', 1)$$);
SELECT expect_error($$SELECT rl_acquire('lease.bucket', 'err_s')$$);
SELECT expect_error($$SELECT rl_acquire('lease.bucket', 'err_s', 'session')$$);
SELECT expect_error($$SELECT rl_release('lease.bucket', 'err_s')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'err_s', 'statement')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'err_s', 'Session')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'err_s', '')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'err_s', NULL)$$);
SELECT expect_error($$SELECT rl_acquire(NULL, 'err_s')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', NULL)$$);
SELECT expect_error($$SELECT rl_acquire(NULL, NULL, NULL)$$);
SELECT expect_error($$SELECT rl_release(NULL, 'err_s')$$);
SELECT expect_error($$SELECT rl_release('lease.basic', NULL)$$);
SELECT expect_error($$SELECT rl_acquire('lease.nope', 'err_s')$$);
SELECT expect_error($$SELECT rl_release('lease.nope', 'err_s')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', '')$$);
SELECT expect_error($$SELECT rl_release('lease.basic', '')$$);
SELECT expect_error($$SELECT rl_peek('lease.basic', 'err_s', 0)$$);
SELECT expect_error($$SELECT rl_peek('lease.basic', 'err_s', 3)$$);
SELECT expect_error($$SELECT rl_peek('lease.basic', 'err_s', NULL)$$);
-- The whole errors, as a client sees them.
SELECT rl_consume('lease.basic', 'err_s');
SELECT rl_acquire('lease.bucket', 'err_s');
SELECT rl_acquire('lease.basic', 'err_s', 'forever');
-- None of the failed calls took a lease or a token.
SELECT pg_temp.free('lease.basic', 'err_s') AS leases_free, pg_temp.free('lease.bucket', 'err_s') AS tokens_left;

--
-- PREPARE TRANSACTION holding transaction leases is refused, and the transaction rolls
-- back (giving them back).
--
BEGIN;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_s');
PREPARE TRANSACTION 'lease_prep_1';
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.free('lease.basic', 'prep_s') AS free_after_refused_prepare;
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'lease_prep_1';
-- Inside a savepoint that was released: still the transaction's, still refused.
BEGIN;
SAVEPOINT a;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_s');
RELEASE SAVEPOINT a;
PREPARE TRANSACTION 'lease_prep_2';
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.free('lease.basic', 'prep_s') AS free_after_refused_prepare;
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'lease_prep_2';
-- Leases rolled back to a savepoint or given back with rl_release are not held, nor are
-- denied ones, and a session lease outlives the transaction anyway: PREPARE goes ahead.
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_full', 'session');
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_full', 'session');
BEGIN;
SAVEPOINT a;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_s');
ROLLBACK TO SAVEPOINT a;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_s');
SELECT rl_release('lease.basic', 'prep_s');
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_full');
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'prep_s', 'session');
PREPARE TRANSACTION 'lease_prep_3';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'lease_prep_3';
SELECT pg_temp.free('lease.basic', 'prep_s') AS free_with_session_lease;
ROLLBACK PREPARED 'lease_prep_3';
-- The session lease is still held after the prepared transaction is gone.
SELECT pg_temp.free('lease.basic', 'prep_s') AS free_after_rollback_prepared;
SELECT rl_release('lease.basic', 'prep_s') AS released, pg_temp.free('lease.basic', 'prep_s') AS free;
SELECT rl_release('lease.basic', 'prep_full'), rl_release('lease.basic', 'prep_full');
SELECT pg_temp.free('lease.basic', 'prep_full') AS free;

--
-- Redis cannot answer: 'open' allows without holding a lease; 'closed' and 'local'
-- deny (a lease cannot be counted anywhere else).
--
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
BEGIN;
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_acquire('lease.open', 'down_s');
SELECT allowed, source FROM rl_acquire('lease.open', 'down_s');
SELECT allowed, source FROM rl_acquire('lease.open', 'down_s', 'session');
SELECT allowed, remaining, capacity, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_acquire('lease.basic', 'down_s');
SELECT allowed, remaining, capacity, retry_after_ms > 0 AS retry_later, policy, source
FROM rl_acquire('lease.local', 'down_s');
SELECT allowed, source FROM rl_acquire('lease.basic', 'down_s', 'session');
SELECT allowed, source FROM rl_peek('lease.open', 'down_s');
SELECT allowed, source FROM rl_peek('lease.basic', 'down_s');
SELECT allowed, source FROM rl_peek('lease.local', 'down_s');
-- Nothing was held, so nothing is given back.
SELECT rl_release('lease.open', 'down_s') AS released;
COMMIT;
RESET ratelimit.redis_url;
-- Redis holds no lease for any of them.
SELECT allowed, remaining, source FROM rl_peek('lease.open', 'down_s');
SELECT allowed, remaining, source FROM rl_peek('lease.basic', 'down_s');
SELECT allowed, remaining, source FROM rl_peek('lease.local', 'down_s');
SELECT rl_release('lease.open', 'down_s') AS released;

-- A lease taken from Redis whose release cannot reach Redis (the URL is wrong when the
-- transaction commits) is logged and left to its TTL: held until idle_ttl, then free.
SET ratelimit.test_clock_ms = '2600000200000';
BEGIN;
SELECT allowed, remaining, source FROM rl_acquire('lease.ttl', 'lost_s');
SET LOCAL ratelimit.redis_url = 'redis://127.0.0.1:1';
COMMIT;
-- The commit put the server's URL back, but the lease is still held.
SELECT current_setting('ratelimit.redis_url') <> 'redis://127.0.0.1:1' AS server_redis_again;
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_peek('lease.ttl', 'lost_s');
SET ratelimit.test_clock_ms = '2600000210000';
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_peek('lease.ttl', 'lost_s');
SELECT allowed, remaining, source FROM rl_acquire('lease.ttl', 'lost_s');

--
-- Privileges: neither function is executable without a grant.
--
CREATE ROLE regress_lease_app;
SET ROLE regress_lease_app;
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'priv_s')$$);
SELECT expect_error($$SELECT rl_acquire('lease.basic', 'priv_s', 'session')$$);
SELECT expect_error($$SELECT rl_release('lease.basic', 'priv_s')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION rl_acquire(text, text, text, interval) TO regress_lease_app;
SET ROLE regress_lease_app;
SELECT allowed, remaining FROM rl_acquire('lease.basic', 'priv_s');
SELECT expect_error($$SELECT rl_release('lease.basic', 'priv_s')$$);
RESET ROLE;
REVOKE ALL ON FUNCTION rl_acquire(text, text, text, interval) FROM regress_lease_app;
DROP ROLE regress_lease_app;
SELECT pg_temp.free('lease.basic', 'priv_s') AS free;

DELETE FROM rl_policy WHERE name LIKE 'lease.%';
