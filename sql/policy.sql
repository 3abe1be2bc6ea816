-- Policies are rows: constraints reject nonsense, versions are bumped by the extension.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');
SELECT name, algorithm, capacity, refill_amount, refill_period, idle_ttl, fail_mode, version > 0 AS has_version
FROM rl_policy;

-- Each constraint, with its SQLSTATE.
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('Upper', 1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('has space', 1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('', 1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES (repeat('a', 64), 1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES (repeat('a', 63), 1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.zero', 0, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.neg', -1, 1, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.refill', 1, 0, '1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '0 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '0.5 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '1.5 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '-1 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '1 month')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, NULL)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.period', 1, 1, '1 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES ('p.mode', 1, 1, '1 s', 'maybe')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES ('p.algo', 'leaky', 1, 1, '1 s')$$);
-- idle_ttl: at least the time to refill completely (10 tokens at 1 a second: 10 s).
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl) VALUES ('p.ttl', 10, 1, '1 s', '9.999 s')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl) VALUES ('p.ttl', 10, 1, '1 s', '10 s')$$);
-- The exact bound: capacity * period_ms / gcd(refill, period_ms) + refill / gcd < 2^53.
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.huge', 9007199254740992, 1, '1 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.huge', 9007199254740990, 1, '1 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.day', 104249992, 1, '1 day')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.day', 104249991, 1, '1 day')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.max', 9223372036854775807, 9223372036854775807, '1 ms')$$);
SELECT expect_error($$UPDATE rl_policy SET capacity = 0 WHERE name = 'reports.export'$$);
-- Concurrency policies: capacity leases, each living at most idle_ttl; no refill.
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('p.lease', 'concurrency', 3, '5 min')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity) VALUES ('p.lease2', 'concurrency', 3)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, idle_ttl) VALUES ('p.lease3', 'concurrency', 3, 1, '1 s', '5 min')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('p.lease4', 'concurrency', 3, '1.5 ms')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, idle_ttl) VALUES ('p.norefill', 3, 1, '5 min')$$);
-- What the scripts cannot hold exactly is refused here, not at every rl_acquire: a
-- capacity of 2^53 or more, an idle_ttl over 2^52 ms (about 142,000 years).
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('p.lease5', 'concurrency', 9223372036854775000, '5 min')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('p.lease6', 'concurrency', 3, '1157407408 days')$$);
SELECT expect_error($$INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('p.lease7', 'concurrency', 9007199254740991, '4503599627370496 ms')$$);
DELETE FROM rl_policy WHERE name = 'p.lease7';
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl) VALUES ('p.ttl', 3, 1, '1 s', '4503599627370497 ms')$$);
-- local_share: (0, 1], and not vanishingly small.
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, local_share) VALUES ('p.share', 1, 1, '1 s', 0)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, local_share) VALUES ('p.share', 1, 1, '1 s', 1.5)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, local_share) VALUES ('p.share', 1, 1, '1 s', 1e-400)$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, local_share) VALUES ('p.share', 1, 1, '1 s', 0.25)$$);
DELETE FROM rl_policy WHERE name LIKE 'p.%' OR name = repeat('a', 63);

-- Each constraint's error says what it requires (its HINT); its SQLSTATE and name are
-- PostgreSQL's own. On an insert, an update, an override; a NULL where none may be is
-- PostgreSQL's 23502, as before.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.hint', 0, 1, '1 second');
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.hint', 10, 1, '1 second');
UPDATE rl_policy SET fail_mode = 'sometimes' WHERE name = 'p.hint';
UPDATE rl_policy SET algorithm = 'sliding_log', refill_amount = NULL, capacity = 20000 WHERE name = 'p.hint';
INSERT INTO rl_override (policy, subject, action, capacity, refill_amount, refill_period) VALUES ('p.hint', 'tenant_1', 'limit', 0, 1, '1 second');
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.null', NULL, 0, '1 second');
\echo :LAST_ERROR_SQLSTATE
DELETE FROM rl_policy WHERE name = 'p.hint';

-- version: new on insert, new when the meaning of stored state changes, kept otherwise.
CREATE TEMP TABLE seen_versions AS SELECT version FROM rl_policy WHERE name = 'reports.export';
-- (Its first version, brought back below: 1 in a fresh database, but not if files ran before.)
SELECT version AS first_version FROM seen_versions \gset
UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'reports.export';
SELECT version = (SELECT version FROM seen_versions) AS kept_on_fail_mode FROM rl_policy WHERE name = 'reports.export';
UPDATE rl_policy SET refill_period = '60 minutes' WHERE name = 'reports.export';
SELECT version = (SELECT version FROM seen_versions) AS kept_on_equal_period FROM rl_policy WHERE name = 'reports.export';
UPDATE rl_policy SET version = 12345 WHERE name = 'reports.export';
SELECT version = (SELECT version FROM seen_versions) AS not_settable_by_hand FROM rl_policy WHERE name = 'reports.export';
UPDATE rl_policy SET capacity = 6 WHERE name = 'reports.export';
SELECT version > (SELECT version FROM seen_versions) AS bumped_on_capacity FROM rl_policy WHERE name = 'reports.export';
UPDATE seen_versions SET version = (SELECT version FROM rl_policy WHERE name = 'reports.export');
UPDATE rl_policy SET refill_amount = 50 WHERE name = 'reports.export';
SELECT version > (SELECT version FROM seen_versions) AS bumped_on_refill_amount FROM rl_policy WHERE name = 'reports.export';
UPDATE seen_versions SET version = (SELECT version FROM rl_policy WHERE name = 'reports.export');
UPDATE rl_policy SET refill_period = '2 hours' WHERE name = 'reports.export';
SELECT version > (SELECT version FROM seen_versions) AS bumped_on_period FROM rl_policy WHERE name = 'reports.export';
-- Dropped and created again, bringing its first version: a new version, never an old one.
UPDATE seen_versions SET version = (SELECT version FROM rl_policy WHERE name = 'reports.export');
DELETE FROM rl_policy WHERE name = 'reports.export';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
VALUES ('reports.export', 6, 50, '2 hours', :first_version);
SELECT version > (SELECT version FROM seen_versions) AS never_reused FROM rl_policy WHERE name = 'reports.export';
-- A row outside the bounds (only possible without the constraint) fails its own
-- decisions, and no others.
ALTER TABLE rl_policy DROP CONSTRAINT rl_policy_exact_check;
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p.broken', 9007199254740991, 1, '1 ms');
SELECT expect_error($$SELECT rl_consume('p.broken', 'tenant_1')$$);
SELECT allowed, source FROM rl_consume('reports.export', 'tenant_broken');
DELETE FROM rl_policy WHERE name = 'p.broken';
ALTER TABLE rl_policy ADD CONSTRAINT rl_policy_exact_check
    CHECK (_rl_bucket_is_exact(capacity, refill_amount, refill_period));

-- Every file makes the policies it uses: this one's is gone.
DELETE FROM rl_policy WHERE name = 'reports.export';
