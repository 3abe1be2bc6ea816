-- Budget that follows the transaction: rl_reserve (refunded when its transaction or
-- savepoint rolls back), rl_peek, rl_refund and rl_reset. The clock does not move, so
-- every level is exact and rl_peek (which takes nothing) shows it.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2400000000000';
-- 10 tokens, 10 an hour: nothing refills while the clock stands still.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('tx.basic', 10, 10, '1 hour', 'closed'),
    ('tx.other', 10, 10, '1 hour', 'closed'),
    ('tx.open', 10, 10, '1 hour', 'open'),
    ('tx.local', 10, 10, '1 hour', 'local');

-- The level of a bucket, as rl_peek sees it (taking nothing).
CREATE FUNCTION pg_temp.level(p text, s text) RETURNS bigint
LANGUAGE sql AS $$ SELECT remaining FROM rl_peek(p, s) $$;

--
-- rl_peek: the decision rl_consume would make, taking nothing.
--
-- A bucket never used is full.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('tx.basic', 'peek_s');
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_peek('tx.basic', 'peek_s', 10);
-- Many peeks take nothing.
SELECT count(*) AS peeks, bool_and(allowed) AS all_allowed, min(remaining), max(remaining)
FROM generate_series(1, 20) AS i, LATERAL rl_peek('tx.basic', 'peek_s', 10);
SELECT allowed, remaining FROM rl_consume('tx.basic', 'peek_s', 7);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('tx.basic', 'peek_s');
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('tx.basic', 'peek_s', 3);
SELECT allowed, remaining, retry_after_ms, reset_after_ms FROM rl_peek('tx.basic', 'peek_s', 3);
-- A cost larger than what is left: denied, with the retry-after rl_consume would give
-- (one token every 360 s: 2 more tokens in 720 s), and still nothing taken.
SELECT allowed, remaining, retry_after_ms, reset_after_ms, source FROM rl_peek('tx.basic', 'peek_s', 5);
SELECT allowed, remaining, retry_after_ms FROM rl_consume('tx.basic', 'peek_s', 5);
SELECT allowed, remaining FROM rl_peek('tx.basic', 'peek_s', 3);
SELECT pg_temp.level('tx.basic', 'peek_s') AS level;
-- An empty bucket: a peek of 1 is denied.
SELECT allowed, remaining FROM rl_consume('tx.basic', 'peek_s', 3);
SELECT allowed, remaining, retry_after_ms FROM rl_peek('tx.basic', 'peek_s');
-- The same checks as rl_consume.
SELECT expect_error($$SELECT rl_peek('tx.basic', 'peek_s', 11)$$);
SELECT expect_error($$SELECT rl_peek('tx.basic', 'peek_s', 0)$$);
SELECT expect_error($$SELECT rl_peek('tx.basic', 'peek_s', NULL)$$);
SELECT expect_error($$SELECT rl_peek(NULL, 'peek_s')$$);
SELECT expect_error($$SELECT rl_peek('tx.basic', NULL)$$);
SELECT expect_error($$SELECT rl_peek('tx.basic', '')$$);
SELECT expect_error($$SELECT rl_peek('tx.nope', 'peek_s')$$);

--
-- rl_reserve: a transaction that rolls back gives its tokens back; a commit keeps them.
--
BEGIN;
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_reserve('tx.basic', 'rb_s', 3);
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'rb_s');
-- The tokens are gone for everyone while the transaction runs.
SELECT pg_temp.level('tx.basic', 'rb_s') AS level;
ROLLBACK;
SELECT pg_temp.level('tx.basic', 'rb_s') AS level_after_rollback;

BEGIN;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'commit_s', 4);
COMMIT;
SELECT pg_temp.level('tx.basic', 'commit_s') AS level_after_commit;
-- Outside a transaction block, the statement's own transaction commits: kept.
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'commit_s', 1);
SELECT pg_temp.level('tx.basic', 'commit_s') AS level_after_autocommit;
-- A statement that fails after reserving rolls back: refunded.
DO $$
BEGIN
    PERFORM rl_reserve('tx.basic', 'commit_s', 2);
    RAISE NOTICE 'level inside: %', pg_temp.level('tx.basic', 'commit_s');
    RAISE EXCEPTION 'the statement fails';
END
$$;
SELECT pg_temp.level('tx.basic', 'commit_s') AS level_after_failed_statement;
-- An error inside a transaction block refunds at once; the ROLLBACK finds nothing to do.
BEGIN;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'commit_s', 5);
SELECT 1 / 0;
SELECT pg_temp.level('tx.basic', 'commit_s');
ROLLBACK;
SELECT pg_temp.level('tx.basic', 'commit_s') AS level_after_error;
-- A COMMIT that fails (a deferred constraint) rolls back: refunded.
CREATE TABLE tx_deferred (id int UNIQUE DEFERRABLE INITIALLY DEFERRED);
BEGIN;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'deferred_s', 3);
INSERT INTO tx_deferred VALUES (1), (1);
COMMIT;
SELECT pg_temp.level('tx.basic', 'deferred_s') AS level_after_failed_commit;
DROP TABLE tx_deferred;
-- Several policies and subjects, several reservations each: all of them come back.
BEGIN;
SELECT policy, s AS subject, allowed, remaining
FROM (VALUES ('tx.basic', 'multi_a', 2), ('tx.basic', 'multi_a', 3), ('tx.basic', 'multi_b', 4),
             ('tx.other', 'multi_a', 5)) AS v(p, s, c),
     LATERAL rl_reserve(p, s, c)
ORDER BY 1, 2, 4 DESC;
ROLLBACK;
SELECT pg_temp.level('tx.basic', 'multi_a') AS basic_a, pg_temp.level('tx.basic', 'multi_b') AS basic_b,
       pg_temp.level('tx.other', 'multi_a') AS other_a;

--
-- Savepoints: ROLLBACK TO refunds only what was reserved since the savepoint
-- (nested savepoints included); RELEASE hands the reservations to the parent.
--
BEGIN;
SELECT remaining FROM rl_reserve('tx.basic', 'sp_s', 1);
SAVEPOINT a;
SELECT remaining FROM rl_reserve('tx.basic', 'sp_s', 2);
SAVEPOINT b;
SELECT remaining FROM rl_reserve('tx.basic', 'sp_s', 3);
SAVEPOINT c;
SELECT remaining FROM rl_reserve('tx.basic', 'sp_s', 1);
-- Undoes c only: 1 back.
ROLLBACK TO SAVEPOINT c;
SELECT pg_temp.level('tx.basic', 'sp_s') AS level_after_rollback_to_c;
-- Undoes b (and c within it): 3 back.
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.level('tx.basic', 'sp_s') AS level_after_rollback_to_b;
-- Rolling back to b again finds nothing more of b's.
ROLLBACK TO SAVEPOINT b;
SELECT pg_temp.level('tx.basic', 'sp_s') AS level_after_second_rollback_to_b;
-- A reservation in b after it was rolled back to, then a rollback to a undoes 2 + 2.
SELECT remaining FROM rl_reserve('tx.basic', 'sp_s', 2);
ROLLBACK TO SAVEPOINT a;
SELECT pg_temp.level('tx.basic', 'sp_s') AS level_after_rollback_to_a;
COMMIT;
-- The first reservation, made before any savepoint, committed.
SELECT pg_temp.level('tx.basic', 'sp_s') AS level_after_commit;

-- RELEASE, then a rollback of the whole transaction: refunded.
BEGIN;
SAVEPOINT a;
SELECT remaining FROM rl_reserve('tx.basic', 'rel_s', 2);
SAVEPOINT b;
SELECT remaining FROM rl_reserve('tx.basic', 'rel_s', 3);
RELEASE SAVEPOINT b;
RELEASE SAVEPOINT a;
SELECT pg_temp.level('tx.basic', 'rel_s') AS level_after_release;
ROLLBACK;
SELECT pg_temp.level('tx.basic', 'rel_s') AS level_after_rollback;

-- RELEASE of an inner savepoint, then ROLLBACK TO the outer one: refunded.
BEGIN;
SELECT remaining FROM rl_reserve('tx.basic', 'rel_s', 1);
SAVEPOINT a;
SAVEPOINT b;
SELECT remaining FROM rl_reserve('tx.basic', 'rel_s', 4);
RELEASE SAVEPOINT b;
SELECT pg_temp.level('tx.basic', 'rel_s') AS level_after_release_b;
ROLLBACK TO SAVEPOINT a;
SELECT pg_temp.level('tx.basic', 'rel_s') AS level_after_rollback_to_a;
-- RELEASE, then COMMIT: kept.
SAVEPOINT c;
SELECT remaining FROM rl_reserve('tx.basic', 'rel_s', 2);
RELEASE SAVEPOINT c;
COMMIT;
SELECT pg_temp.level('tx.basic', 'rel_s') AS level_after_commit;

-- Savepoints side by side: one rolled back to and released (nothing left of it), one
-- released (kept), one rolled back to (refunded); the top level's own reservation kept.
BEGIN;
SAVEPOINT a;
SELECT remaining FROM rl_reserve('tx.basic', 'sib_s', 1);
ROLLBACK TO SAVEPOINT a;
RELEASE SAVEPOINT a;
SELECT remaining FROM rl_reserve('tx.basic', 'sib_s', 2);
SAVEPOINT b;
SELECT remaining FROM rl_reserve('tx.basic', 'sib_s', 3);
RELEASE SAVEPOINT b;
SAVEPOINT c;
SELECT remaining FROM rl_reserve('tx.basic', 'sib_s', 4);
ROLLBACK TO SAVEPOINT c;
SELECT pg_temp.level('tx.basic', 'sib_s') AS level_before_commit;
COMMIT;
SELECT pg_temp.level('tx.basic', 'sib_s') AS level_after_commit;

--
-- PL/pgSQL: an EXCEPTION block that catches an error refunds what was reserved inside
-- it; a block that ends normally hands its reservations to the enclosing transaction.
--
DO $$
BEGIN
    PERFORM rl_reserve('tx.basic', 'exc_s', 2);
    BEGIN
        PERFORM rl_reserve('tx.basic', 'exc_s', 3);
        PERFORM rl_reserve('tx.other', 'exc_s', 4);
        RAISE NOTICE 'inside the block: % and %', pg_temp.level('tx.basic', 'exc_s'),
            pg_temp.level('tx.other', 'exc_s');
        PERFORM 1 / (SELECT 0);
    EXCEPTION WHEN division_by_zero THEN
        RAISE NOTICE 'caught: % and %', pg_temp.level('tx.basic', 'exc_s'),
            pg_temp.level('tx.other', 'exc_s');
    END;
    -- A block that succeeds keeps its reservation.
    BEGIN
        PERFORM rl_reserve('tx.basic', 'exc_s', 1);
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'not reached';
    END;
    RAISE NOTICE 'at the end: %', pg_temp.level('tx.basic', 'exc_s');
END
$$;
SELECT pg_temp.level('tx.basic', 'exc_s') AS basic, pg_temp.level('tx.other', 'exc_s') AS other;

-- The pattern an application uses: reserve several budgets; when one of them is over
-- its limit (rl_enforce raises RL429), the ones already reserved come back.
SELECT allowed, remaining FROM rl_consume('tx.other', 'enf_s', 9);
CREATE FUNCTION pg_temp.reserve_both(s text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rl_reserve('tx.basic', s, 5);
    PERFORM rl_enforce('tx.other', s, 2);
    RETURN 'granted';
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    RETURN 'denied: ' || SQLERRM;
END
$$;
SELECT pg_temp.reserve_both('enf_s');
SELECT pg_temp.level('tx.basic', 'enf_s') AS basic, pg_temp.level('tx.other', 'enf_s') AS other;

--
-- A procedure that commits midway keeps what it committed; its later ROLLBACK, or an
-- error, refunds only the rest.
--
CREATE PROCEDURE tx_proc(s text, fail boolean)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rl_reserve('tx.basic', s, 2);
    COMMIT;
    RAISE NOTICE 'after COMMIT: %', pg_temp.level('tx.basic', s);
    PERFORM rl_reserve('tx.basic', s, 3);
    ROLLBACK;
    RAISE NOTICE 'after ROLLBACK: %', pg_temp.level('tx.basic', s);
    PERFORM rl_reserve('tx.basic', s, 1);
    COMMIT;
    PERFORM rl_reserve('tx.basic', s, 4);
    RAISE NOTICE 'before the end: %', pg_temp.level('tx.basic', s);
    IF fail THEN
        RAISE EXCEPTION 'the procedure fails';
    END IF;
END
$$;
CALL tx_proc('proc_ok', false);
SELECT pg_temp.level('tx.basic', 'proc_ok') AS level_after_call;
CALL tx_proc('proc_fail', true);
SELECT pg_temp.level('tx.basic', 'proc_fail') AS level_after_failed_call;
DROP PROCEDURE tx_proc(text, boolean);

--
-- A denied rl_reserve reserves nothing: a rollback gives nothing back.
--
SELECT allowed, remaining FROM rl_consume('tx.basic', 'deny_s', 8);
BEGIN;
SELECT allowed, remaining, retry_after_ms, source FROM rl_reserve('tx.basic', 'deny_s', 5);
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'deny_s', 2);
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'deny_s', 1);
ROLLBACK;
-- Only the granted 2 came back: the denied 5 and 1 were never taken.
SELECT pg_temp.level('tx.basic', 'deny_s') AS level_after_rollback;

-- A reservation granted by fail_open took no token: none is given back. (The URL is
-- set back inside the savepoint, so the refund, if there were one, would reach Redis.)
SELECT allowed, remaining FROM rl_consume('tx.open', 'open_s', 4);
BEGIN;
SET LOCAL ratelimit.redis_url = 'redis://127.0.0.1:1';
SAVEPOINT a;
SELECT allowed, remaining, source FROM rl_reserve('tx.open', 'open_s', 3);
RESET ratelimit.redis_url;
ROLLBACK TO SAVEPOINT a;
COMMIT;
SELECT pg_temp.level('tx.open', 'open_s') AS level_after_rollback;

--
-- rl_refund: gives tokens back, never above capacity.
--
SELECT allowed, remaining FROM rl_consume('tx.basic', 'refund_s', 6);
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, source
FROM rl_refund('tx.basic', 'refund_s', 2);
SELECT pg_temp.level('tx.basic', 'refund_s') AS level;
-- An amount above capacity is capped: the bucket is full, not fuller.
SELECT allowed, remaining, reset_after_ms FROM rl_refund('tx.basic', 'refund_s', 1000000);
SELECT pg_temp.level('tx.basic', 'refund_s') AS level;
SELECT allowed, remaining FROM rl_consume('tx.basic', 'refund_s', 10);
SELECT allowed, remaining FROM rl_consume('tx.basic', 'refund_s', 1);
-- A full bucket stays full.
SELECT allowed, remaining FROM rl_refund('tx.basic', 'full_s', 5);
SELECT pg_temp.level('tx.basic', 'full_s') AS level;
-- A reservation on a full bucket, a large refund, then the reservation's own refund on
-- rollback: still no more than capacity.
BEGIN;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'cap_s', 1);
SELECT allowed, remaining FROM rl_refund('tx.basic', 'cap_s', 1000);
SELECT pg_temp.level('tx.basic', 'cap_s') AS level_inside;
ROLLBACK;
SELECT pg_temp.level('tx.basic', 'cap_s') AS level_after_rollback;
SELECT allowed, remaining FROM rl_consume('tx.basic', 'cap_s', 10);
SELECT allowed, remaining FROM rl_consume('tx.basic', 'cap_s', 1);
-- Errors: NULLs are 22004, an amount of 0 or less is 22023, an unknown policy 42704.
SELECT expect_error($$SELECT rl_refund('tx.basic', 'refund_s', NULL)$$);
SELECT expect_error($$SELECT rl_refund(NULL, 'refund_s', 1)$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', NULL, 1)$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', 'refund_s', 0)$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', 'refund_s', -1)$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', 'refund_s', -9223372036854775808)$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', '', 1)$$);
SELECT expect_error($$SELECT rl_refund('tx.nope', 'refund_s', 1)$$);
-- The whole error, as a client sees it.
SELECT rl_refund('tx.basic', 'refund_s', 0);
-- Nothing was refunded by the failed calls.
SELECT pg_temp.level('tx.basic', 'refund_s') AS level;
-- Redis cannot answer: nothing refunded, and it says so.
SELECT allowed, remaining FROM rl_consume('tx.basic', 'refund_down', 4);
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT allowed, capacity, policy, source FROM rl_refund('tx.basic', 'refund_down', 2);
RESET ratelimit.redis_url;
SELECT pg_temp.level('tx.basic', 'refund_down') AS level;

--
-- rl_reset: the bucket is forgotten, so it is full again.
--
SELECT allowed, remaining FROM rl_consume('tx.basic', 'reset_s', 9);
SELECT rl_reset('tx.basic', 'reset_s');
SELECT pg_temp.level('tx.basic', 'reset_s') AS level;
SELECT allowed, remaining FROM rl_consume('tx.basic', 'reset_s', 10);
-- A bucket that was never used: already full.
SELECT rl_reset('tx.basic', 'reset_never');
SELECT pg_temp.level('tx.basic', 'reset_never') AS level;
-- Only that subject's bucket of that policy.
SELECT allowed, remaining FROM rl_consume('tx.basic', 'reset_a', 5);
SELECT allowed, remaining FROM rl_consume('tx.basic', 'reset_b', 5);
SELECT allowed, remaining FROM rl_consume('tx.other', 'reset_a', 5);
SELECT rl_reset('tx.basic', 'reset_a');
SELECT pg_temp.level('tx.basic', 'reset_a') AS basic_a, pg_temp.level('tx.basic', 'reset_b') AS basic_b,
       pg_temp.level('tx.other', 'reset_a') AS other_a;
-- Redis cannot answer: false, and nothing changed.
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT rl_reset('tx.basic', 'reset_b');
RESET ratelimit.redis_url;
SELECT pg_temp.level('tx.basic', 'reset_b') AS level;
SELECT expect_error($$SELECT rl_reset(NULL, 'reset_s')$$);
SELECT expect_error($$SELECT rl_reset('tx.basic', NULL)$$);
SELECT expect_error($$SELECT rl_reset('tx.nope', 'reset_s')$$);

--
-- PREPARE TRANSACTION with reservations pending is refused, and the transaction rolls
-- back (refunding them).
--
BEGIN;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'prep_s', 4);
PREPARE TRANSACTION 'tx_prep_1';
\echo :LAST_ERROR_SQLSTATE
-- No transaction is left open and nothing was prepared.
SELECT pg_temp.level('tx.basic', 'prep_s') AS level_after_refused_prepare;
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'tx_prep_1';
-- Inside a savepoint that was released: still pending, still refused.
BEGIN;
SAVEPOINT a;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'prep_s', 2);
RELEASE SAVEPOINT a;
PREPARE TRANSACTION 'tx_prep_2';
\echo :LAST_ERROR_SQLSTATE
SELECT pg_temp.level('tx.basic', 'prep_s') AS level_after_refused_prepare;
-- Once the reservations are rolled back to a savepoint (or were denied), none are
-- pending: PREPARE goes ahead, and rl_consume is fine in a prepared transaction.
BEGIN;
SAVEPOINT a;
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'prep_s', 3);
ROLLBACK TO SAVEPOINT a;
SELECT allowed, remaining FROM rl_consume('tx.basic', 'prep_s', 1);
SELECT allowed, remaining FROM rl_reserve('tx.basic', 'prep_s', 10);
PREPARE TRANSACTION 'tx_prep_3';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'tx_prep_3';
ROLLBACK PREPARED 'tx_prep_3';
SELECT pg_temp.level('tx.basic', 'prep_s') AS level_after_prepared;

--
-- 'local' fail mode with Redis unreachable: a reservation granted by the local bucket
-- is refunded to the local bucket.
--
SELECT allowed, remaining, source FROM rl_consume('tx.local', 'local_s', 5);
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
-- Peeks take nothing from the local bucket either.
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s', 3);
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s', 3);
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('tx.local', 'local_s', 4);
SAVEPOINT a;
SELECT allowed, remaining, source FROM rl_reserve('tx.local', 'local_s', 3);
ROLLBACK TO SAVEPOINT a;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
ROLLBACK;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
-- Granted locally, then Redis is back before the rollback: the refund still goes to
-- the local bucket, and Redis's bucket (5 left) is left alone.
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('tx.local', 'local_s', 6);
RESET ratelimit.redis_url;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
ROLLBACK;
SELECT current_setting('ratelimit.redis_url') = 'redis://127.0.0.1:1' AS redis_unreachable_again;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
RESET ratelimit.redis_url;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
-- A commit keeps the local tokens spent.
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('tx.local', 'local_s', 2);
COMMIT;
SELECT allowed, remaining, source FROM rl_peek('tx.local', 'local_s');
RESET ratelimit.redis_url;

--
-- Privileges: none of the new functions is executable without a grant.
--
SELECT proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
FROM pg_proc p
WHERE proname IN ('rl_reserve', 'rl_peek', 'rl_refund', 'rl_reset')
ORDER BY 1;
CREATE ROLE regress_tx_app;
SET ROLE regress_tx_app;
SELECT expect_error($$SELECT rl_reserve('tx.basic', 'priv_s')$$);
SELECT expect_error($$SELECT rl_reserve('tx.basic', 'priv_s', 1)$$);
SELECT expect_error($$SELECT rl_peek('tx.basic', 'priv_s')$$);
SELECT expect_error($$SELECT rl_refund('tx.basic', 'priv_s', 1)$$);
SELECT expect_error($$SELECT rl_reset('tx.basic', 'priv_s')$$);
RESET ROLE;
-- A grant of one is a grant of that one only.
GRANT EXECUTE ON FUNCTION rl_peek(text, text, bigint) TO regress_tx_app;
SET ROLE regress_tx_app;
SELECT allowed, remaining FROM rl_peek('tx.basic', 'priv_s');
SELECT expect_error($$SELECT rl_reserve('tx.basic', 'priv_s')$$);
RESET ROLE;
SELECT pg_temp.level('tx.basic', 'priv_s') AS level;
REVOKE ALL ON FUNCTION rl_peek(text, text, bigint) FROM regress_tx_app;
DROP ROLE regress_tx_app;

DELETE FROM rl_policy WHERE name LIKE 'tx.%';
