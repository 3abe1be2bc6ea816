-- Per-subject overrides (rl_override): another limit with a version and a bucket of its
-- own ('limit'), always allowed ('allow') or always denied ('deny'), until expires_at.
-- The clock does not move unless a test moves it: 2800000000000 ms is 2058-09-23 09:46:40 UTC.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2800000000000';
-- One token every 720 s (ov.api), 1200 s (ov.user).
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES
    ('ov.api', 5, 5, '1 hour'),
    ('ov.user', 3, 3, '1 hour');
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES
    ('ov.lease', 'concurrency', 1, '1 minute');
SELECT version AS api_v FROM rl_policy WHERE name = 'ov.api' \gset

-- The level of a bucket, as rl_peek sees it (taking nothing).
CREATE FUNCTION pg_temp.level(p text, s text) RETURNS bigint
LANGUAGE sql AS $$ SELECT remaining FROM rl_peek(p, s) $$;
-- An error's SQLSTATE, the constraint it names (if any) and its message.
CREATE FUNCTION pg_temp.fails(statement text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    constraint_name text;
BEGIN
    EXECUTE statement;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS constraint_name = CONSTRAINT_NAME;
    RETURN SQLSTATE || coalesce(' ' || nullif(constraint_name, ''), '') || ': ' || SQLERRM;
END
$$;

--
-- 'limit' on a token bucket: the subject's own capacity, refill, version and bucket.
--
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, reason)
VALUES ('ov.api', 'premium', 10, 10, '1 hour', 'pays more')
RETURNING policy, subject, action, capacity, refill_amount, refill_period, expires_at, reason,
          version > :api_v AS new_version,
          version = (SELECT last_value FROM rl_policy_version_seq) AS from_the_sequence;
SELECT version AS premium_v FROM rl_override WHERE subject = 'premium' \gset
-- The policy's version is untouched.
SELECT version = :api_v AS policy_version_kept FROM rl_policy WHERE name = 'ov.api';
-- premium: capacity 10, one token every 360 s; a cost above the policy's 5 is fine.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy,
       version = :premium_v AS override_version, source
FROM rl_consume('ov.api', 'premium', 6);
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, source
FROM rl_consume('ov.api', 'premium', 4);
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, source
FROM rl_consume('ov.api', 'premium', 2);
SELECT expect_error($$SELECT rl_enforce('ov.api', 'premium')$$);
-- A cost above the override's capacity is bad input, like one above a policy's.
SELECT expect_error($$SELECT rl_consume('ov.api', 'premium', 11)$$);
SELECT expect_error($$SELECT rl_peek('ov.api', 'premium', 11)$$);
-- Everyone else keeps the policy: capacity 5, one token every 720 s, the policy's version.
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy,
       version = :api_v AS policy_version, source
FROM rl_consume('ov.api', 'regular', 2);
SELECT expect_error($$SELECT rl_consume('ov.api', 'regular', 6)$$);
-- Subjects are compared exactly.
SELECT capacity, version = :api_v AS policy_version FROM rl_consume('ov.api', 'Premium');
SELECT capacity, version = :api_v AS policy_version FROM rl_consume('ov.api', 'premium ');
SELECT capacity, version = (SELECT version FROM rl_policy WHERE name = 'ov.user') AS policy_version
FROM rl_peek('ov.user', 'premium');

--
-- 'limit' on a concurrency policy: a capacity only.
--
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.lease', 'big', 3, 3, '1 s')$$);
-- A lease count the script cannot hold exactly (2^53 or more) is refused here.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity) VALUES ('ov.lease', 'big', 9223372036854775000)$$);
INSERT INTO rl_override (policy, subject, capacity) VALUES ('ov.lease', 'big', 3);
SELECT version AS lease_big_v FROM rl_override WHERE policy = 'ov.lease' AND subject = 'big' \gset
BEGIN;
SELECT allowed, remaining, capacity, version = :lease_big_v AS override_version, source
FROM rl_acquire('ov.lease', 'big');
SELECT allowed, remaining FROM rl_acquire('ov.lease', 'big');
SELECT allowed, remaining FROM rl_acquire('ov.lease', 'big');
SELECT allowed, remaining, retry_after_ms FROM rl_acquire('ov.lease', 'big');
SELECT allowed, remaining, capacity, version = :lease_big_v AS override_version, source
FROM rl_peek('ov.lease', 'big');
SELECT allowed, remaining, capacity,
       version = (SELECT version FROM rl_policy WHERE name = 'ov.lease') AS policy_version
FROM rl_acquire('ov.lease', 'small');
SELECT allowed, remaining FROM rl_acquire('ov.lease', 'small');
COMMIT;
SELECT pg_temp.level('ov.lease', 'big') AS big_free_after_commit;

--
-- 'allow': allowed, the policy's capacity as remaining, nothing counted or refunded.
--
SELECT allowed, remaining FROM rl_consume('ov.api', 'vip', 2);
INSERT INTO rl_override (policy, subject, action, reason) VALUES ('ov.api', 'vip', 'allow', 'ours');
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy,
       version = :api_v AS policy_version, source
FROM rl_consume('ov.api', 'vip', 5);
SELECT allowed, remaining, source FROM rl_consume('ov.api', 'vip', 5);
SELECT allowed, remaining, source FROM rl_enforce('ov.api', 'vip', 5);
SELECT allowed, remaining, source FROM rl_peek('ov.api', 'vip', 5);
-- A reservation granted by the override takes nothing, so a rollback gives nothing back.
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('ov.api', 'vip', 4);
ROLLBACK;
-- The cost is still checked against the policy's capacity.
SELECT expect_error($$SELECT rl_consume('ov.api', 'vip', 6)$$);
-- Without the override, the bucket is as it was before it: 3 tokens.
DELETE FROM rl_override WHERE policy = 'ov.api' AND subject = 'vip';
SELECT pg_temp.level('ov.api', 'vip') AS vip_level;

--
-- 'deny': denied, retry after a day (no expiry), nothing counted; rl_enforce raises RL429.
--
INSERT INTO rl_override (policy, subject, action, reason) VALUES ('ov.api', 'spammer', 'deny', 'abuse');
SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy,
       version = :api_v AS policy_version, source
FROM rl_consume('ov.api', 'spammer');
SELECT allowed, remaining, retry_after_ms, source FROM rl_consume('ov.api', 'spammer');
SELECT allowed, remaining, retry_after_ms, source FROM rl_peek('ov.api', 'spammer');
SELECT expect_error($$SELECT rl_enforce('ov.api', 'spammer')$$);
SELECT allowed, remaining, retry_after_ms, source FROM rl_reserve('ov.api', 'spammer');
-- A deny on a concurrency policy denies the lease.
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.lease', 'spammer', 'deny');
SELECT allowed, remaining, retry_after_ms, source FROM rl_acquire('ov.lease', 'spammer');
-- Nothing was counted: without the override the bucket is full.
DELETE FROM rl_override WHERE subject = 'spammer';
SELECT pg_temp.level('ov.api', 'spammer') AS spammer_level,
       pg_temp.level('ov.lease', 'spammer') AS spammer_leases;

--
-- Shadow and disabled policies: a deny never denies there.
--
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, mode) VALUES
    ('ov.shadow', 2, 2, '1 hour', 'shadow'),
    ('ov.off', 2, 2, '1 hour', 'disabled');
INSERT INTO rl_override (policy, subject, action) VALUES
    ('ov.shadow', 'spammer', 'deny'),
    ('ov.off', 'spammer', 'deny');
SELECT allowed, remaining, capacity, retry_after_ms, source FROM rl_consume('ov.shadow', 'spammer');
SELECT allowed, source FROM rl_enforce('ov.shadow', 'spammer');
SELECT allowed, remaining, capacity, retry_after_ms, source FROM rl_consume('ov.off', 'spammer');
SELECT allowed, source FROM rl_enforce('ov.off', 'spammer');
-- Enforced again, the deny denies.
UPDATE rl_policy SET mode = 'enforce' WHERE name = 'ov.shadow';
SELECT allowed, source FROM rl_consume('ov.shadow', 'spammer');
UPDATE rl_policy SET mode = 'shadow' WHERE name = 'ov.shadow';
-- A 'limit' override in a shadow policy decides with its own limits and never denies.
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
VALUES ('ov.shadow', 'tiny', 1, 1, '1 hour');
SELECT allowed, remaining, capacity, source FROM rl_consume('ov.shadow', 'tiny');
SELECT allowed, remaining, capacity, retry_after_ms, source FROM rl_consume('ov.shadow', 'tiny');

--
-- rl_consume_all: an 'allow' check takes nothing; an enforced 'deny' check denies the
-- group and nothing is charged; a shadow 'deny' check stops nothing.
--
INSERT INTO rl_override (policy, subject, action) VALUES
    ('ov.user', 'acme/vip', 'allow'),
    ('ov.user', 'acme/banned', 'deny'),
    ('ov.shadow', 'acme/banned', 'deny');
SELECT ordinality AS n, allowed, remaining, capacity, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['ov.api', 'ov.user'], ARRAY['acme', 'acme/vip'], ARRAY[2, 3]) WITH ORDINALITY;
SELECT ordinality AS n, allowed, remaining, capacity, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['ov.api', 'ov.user'], ARRAY['acme', 'acme/banned'], ARRAY[1, 1]) WITH ORDINALITY;
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['ov.user', 'ov.api', 'ov.user'], ARRAY['acme/bob', 'acme', 'acme/banned']) WITH ORDINALITY;
SELECT pg_temp.level('ov.api', 'acme') AS acme, pg_temp.level('ov.user', 'acme/bob') AS bob;
SELECT ordinality AS n, allowed, remaining, retry_after_ms, policy, source
FROM rl_consume_all(ARRAY['ov.api', 'ov.shadow'], ARRAY['acme', 'acme/banned']) WITH ORDINALITY;
SELECT pg_temp.level('ov.api', 'acme') AS acme;
-- Without the overrides, their buckets show that they were never charged.
DELETE FROM rl_override WHERE subject LIKE 'acme/%';
SELECT pg_temp.level('ov.user', 'acme/vip') AS vip, pg_temp.level('ov.user', 'acme/banned') AS banned,
       pg_temp.level('ov.shadow', 'acme/banned') AS shadow_banned;

--
-- Expiry: an override applies until expires_at (exclusive), then the policy does,
-- with no change to the table. expires_at is 60 s after the test clock.
--
INSERT INTO rl_override (policy, subject, action, expires_at)
VALUES ('ov.api', 'tmp', 'deny', to_timestamp(2800000060));
SELECT allowed, retry_after_ms, source FROM rl_consume('ov.api', 'tmp');
SET ratelimit.test_clock_ms = '2800000059999';
SELECT allowed, retry_after_ms, source FROM rl_consume('ov.api', 'tmp');
SELECT expect_error($$SELECT rl_enforce('ov.api', 'tmp')$$);
SET ratelimit.test_clock_ms = '2800000060000';
SELECT allowed, remaining, capacity, version = :api_v AS policy_version, source FROM rl_consume('ov.api', 'tmp');
SET ratelimit.test_clock_ms = '2800003600000';
SELECT allowed, remaining, source FROM rl_consume('ov.api', 'tmp');
-- Back before expires_at, it applies again.
SET ratelimit.test_clock_ms = '2800000000000';
SELECT allowed, retry_after_ms, source FROM rl_consume('ov.api', 'tmp');
-- An expiring 'limit': its own bucket until then, the policy's afterwards.
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, expires_at)
VALUES ('ov.api', 'trial', 50, 50, '1 hour', to_timestamp(2800000060));
SELECT version AS trial_v FROM rl_override WHERE subject = 'trial' \gset
SELECT allowed, remaining, capacity, version = :trial_v AS override_version FROM rl_consume('ov.api', 'trial', 20);
SET ratelimit.test_clock_ms = '2800000060000';
SELECT allowed, remaining, capacity, version = :api_v AS policy_version FROM rl_consume('ov.api', 'trial', 1);
SET ratelimit.test_clock_ms = '2800000000000';
-- An expiring 'allow'.
INSERT INTO rl_override (policy, subject, action, expires_at) VALUES ('ov.api', 'guest', 'allow', to_timestamp(2800000060));
SELECT allowed, remaining, source FROM rl_consume('ov.api', 'guest', 5);
SET ratelimit.test_clock_ms = '2800000060000';
SELECT allowed, remaining, source FROM rl_consume('ov.api', 'guest', 5);
SET ratelimit.test_clock_ms = '2800000000000';
-- A deny that expires in more than a day says so.
INSERT INTO rl_override (policy, subject, action, expires_at) VALUES ('ov.api', 'long', 'deny', to_timestamp(2800000000) + interval '3 days');
SELECT allowed, retry_after_ms, source FROM rl_consume('ov.api', 'long');
-- An override cannot be born expired (expires_at must come after created_at, by default now())...
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action, expires_at) VALUES ('ov.api', 'x', 'deny', now())$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action, expires_at) VALUES ('ov.api', 'x', 'deny', now() - interval '1 day')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action, created_at, expires_at) VALUES ('ov.api', 'x', 'deny', '2030-01-02', '2030-01-01')$$);
SELECT pg_temp.fails($$UPDATE rl_override SET expires_at = created_at WHERE subject = 'tmp'$$);
-- ... but one created before it expired (as a restore brings back) is kept, and does nothing.
INSERT INTO rl_override (policy, subject, action, created_at, expires_at)
VALUES ('ov.api', 'old', 'deny', '2020-01-01 00:00:00+00', '2020-01-02 00:00:00+00');
SELECT allowed, source FROM rl_consume('ov.api', 'old');

--
-- Bad rows, each with its SQLSTATE and constraint.
--
-- An unknown policy.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.nope', 'x', 'deny')$$);
-- 'allow' and 'deny' carry no limits.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action, capacity) VALUES ('ov.api', 'x', 'deny', 3)$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action, refill_amount, refill_period) VALUES ('ov.api', 'x', 'allow', 1, '1 s')$$);
-- 'limit' (the default action) needs a capacity, and on a token bucket a refill too.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject) VALUES ('ov.api', 'x')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity) VALUES ('ov.api', 'x', 3)$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount) VALUES ('ov.api', 'x', 3, 3)$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_period) VALUES ('ov.api', 'x', 3, '1 s')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject) VALUES ('ov.lease', 'x')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity) VALUES ('ov.lease', 'x', 0)$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 0, 3, '1 s')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 3, 0, '1 s')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 3, 3, '1 month')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 3, 3, '1.5 ms')$$);
-- The 2^53 bound: capacity * period_ms / g + refill_amount / g < 2^53.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 9007199254740991, 1, '1 ms')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 104249992, 1, '1 day')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'x', 9007199254740990, 1, '1 ms')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.api', 'y', 104249991, 1, '1 day')$$);
SELECT allowed, remaining, capacity FROM rl_consume('ov.api', 'x', 9007199254740990);
SELECT allowed, remaining, capacity FROM rl_consume('ov.api', 'y', 104249991);
DELETE FROM rl_override WHERE subject IN ('x', 'y');
-- Subjects: 1 to 1024 bytes.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', '', 'deny')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', repeat('x', 1025), 'deny')$$);
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', repeat('x', 1024), 'deny'), ('ov.api', 'user@example.com', 'deny');
SELECT allowed, source FROM rl_consume('ov.api', repeat('x', 1024));
SELECT allowed, source FROM rl_consume('ov.api', 'user@example.com');
DELETE FROM rl_override WHERE subject IN (repeat('x', 1024), 'user@example.com');
-- Actions, NULLs, duplicates.
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'x', 'maybe')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'x', NULL)$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', NULL, 'deny')$$);
SELECT pg_temp.fails($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'premium', 'deny')$$);
-- The same rules on UPDATE.
SELECT pg_temp.fails($$UPDATE rl_override SET action = 'deny' WHERE subject = 'premium'$$);
SELECT pg_temp.fails($$UPDATE rl_override SET refill_amount = NULL, refill_period = NULL WHERE subject = 'premium'$$);
SELECT pg_temp.fails($$UPDATE rl_override SET refill_amount = 1, refill_period = '1 s' WHERE policy = 'ov.lease' AND subject = 'big'$$);
SELECT pg_temp.fails($$UPDATE rl_override SET policy = 'ov.nope' WHERE subject = 'premium'$$);
-- A policy with 'limit' overrides keeps its algorithm; with only 'allow' and 'deny' it may change.
SELECT pg_temp.fails($$UPDATE rl_policy SET algorithm = 'concurrency', refill_amount = NULL, refill_period = NULL, idle_ttl = '1 day' WHERE name = 'ov.api'$$);
SELECT pg_temp.fails($$UPDATE rl_policy SET algorithm = 'token_bucket', refill_amount = 1, refill_period = '1 s', idle_ttl = NULL WHERE name = 'ov.lease'$$);
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('ov.morph', 2, 2, '1 hour');
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.morph', 'spammer', 'deny');
UPDATE rl_policy SET algorithm = 'concurrency', refill_amount = NULL, refill_period = NULL, idle_ttl = '1 day'
WHERE name = 'ov.morph';
SELECT allowed, source FROM rl_acquire('ov.morph', 'spammer');

--
-- Versions: a new one when action, capacity or refill change; the same one otherwise.
--
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
VALUES ('ov.api', 'gold', 20, 20, '1 hour');
SELECT version AS gold_v1 FROM rl_override WHERE subject = 'gold' \gset
SELECT remaining, version = :gold_v1 AS v1 FROM rl_consume('ov.api', 'gold', 5);
-- reason, expires_at and created_at keep it, and the bucket.
UPDATE rl_override SET reason = 'renewed', expires_at = to_timestamp(2900000000) WHERE subject = 'gold';
SELECT version = :gold_v1 AS same_version FROM rl_override WHERE subject = 'gold';
SELECT remaining, version = :gold_v1 AS v1 FROM rl_consume('ov.api', 'gold', 5);
-- The version cannot be set by hand.
UPDATE rl_override SET version = 1 WHERE subject = 'gold';
SELECT version = :gold_v1 AS same_version FROM rl_override WHERE subject = 'gold';
-- A statement that writes the same limits keeps it.
UPDATE rl_override SET capacity = 20 WHERE subject = 'gold';
SELECT version = :gold_v1 AS same_version FROM rl_override WHERE subject = 'gold';
-- capacity: a new version and a new (full) bucket.
UPDATE rl_override SET capacity = 30 WHERE subject = 'gold';
SELECT version AS gold_v2 FROM rl_override WHERE subject = 'gold' \gset
SELECT :gold_v2 > :gold_v1 AS newer;
SELECT remaining, capacity, version = :gold_v2 AS v2 FROM rl_consume('ov.api', 'gold', 5);
-- refill: another.
UPDATE rl_override SET refill_amount = 60 WHERE subject = 'gold';
SELECT version AS gold_v3 FROM rl_override WHERE subject = 'gold' \gset
SELECT :gold_v3 > :gold_v2 AS newer;
UPDATE rl_override SET refill_period = '2 hours' WHERE subject = 'gold';
SELECT version AS gold_v4 FROM rl_override WHERE subject = 'gold' \gset
SELECT :gold_v4 > :gold_v3 AS newer;
-- action: another.
UPDATE rl_override SET action = 'allow', capacity = NULL, refill_amount = NULL, refill_period = NULL
WHERE subject = 'gold';
SELECT version AS gold_v5 FROM rl_override WHERE subject = 'gold' \gset
SELECT :gold_v5 > :gold_v4 AS newer;
UPDATE rl_override SET action = 'deny' WHERE subject = 'gold';
SELECT version > :gold_v5 AS newer FROM rl_override WHERE subject = 'gold';
-- Changing the policy leaves its overrides' versions (and buckets) alone.
UPDATE rl_policy SET capacity = 6 WHERE name = 'ov.api';
SELECT version AS api_v2 FROM rl_policy WHERE name = 'ov.api' \gset
SELECT :api_v2 > :api_v AS policy_newer,
       (SELECT version FROM rl_override WHERE subject = 'premium') = :premium_v AS premium_kept;
SELECT allowed, remaining, capacity, version = :premium_v AS override_version FROM rl_peek('ov.api', 'premium');
SELECT allowed, remaining, capacity, version = :api_v2 AS policy_version FROM rl_peek('ov.api', 'regular');
-- Deleted and inserted again with the same limits: a version never used before, a new bucket.
DELETE FROM rl_override WHERE subject = 'premium';
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
VALUES ('ov.api', 'premium', 10, 10, '1 hour');
SELECT version > :gold_v5 AS fresh_version FROM rl_override WHERE subject = 'premium';
SELECT remaining, capacity FROM rl_peek('ov.api', 'premium');
-- A policy renamed takes its overrides along (ON UPDATE CASCADE), each with a new version.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('ov.old', 2, 2, '1 hour');
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.old', 'm', 4, 4, '1 hour');
SELECT version AS m_v FROM rl_override WHERE subject = 'm' \gset
UPDATE rl_policy SET name = 'ov.new' WHERE name = 'ov.old';
SELECT policy, subject, version > :m_v AS new_version FROM rl_override WHERE subject = 'm';
SELECT allowed, remaining, capacity, source FROM rl_consume('ov.new', 'm');

--
-- A superuser's row that brings a version (as pg_restore does) keeps it, unless that
-- name and version meant other limits; everyone else gets a new one (privileges, roles).
--
SELECT last_value + 50 AS kept_v FROM rl_policy_version_seq \gset
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 4, 4, '1 hour', :kept_v);
SELECT version = :kept_v AS kept FROM rl_policy WHERE name = 'ov.restored';
-- The sequence moved past it: the next version is above.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('ov.after', 4, 4, '1 hour');
SELECT version > :kept_v AS above FROM rl_policy WHERE name = 'ov.after';
-- Dropped and brought back with the same limits and version: kept, same bucket.
SELECT remaining FROM rl_consume('ov.restored', 's', 3);
DELETE FROM rl_policy WHERE name = 'ov.restored';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 4, 4, '1 hour', :kept_v);
SELECT version = :kept_v AS kept FROM rl_policy WHERE name = 'ov.restored';
SELECT remaining, version = :kept_v AS kept FROM rl_consume('ov.restored', 's');
-- Brought back with other limits under that version: a new one (the old bucket is not misread).
DELETE FROM rl_policy WHERE name = 'ov.restored';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 8, 8, '1 hour', :kept_v);
SELECT version > :kept_v AS new_version FROM rl_policy WHERE name = 'ov.restored';
SELECT remaining, capacity FROM rl_consume('ov.restored', 's');
-- The same for overrides: the version of another override or of the policy is not taken.
SELECT version AS restored_v FROM rl_policy WHERE name = 'ov.restored' \gset
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 'a', 2, 2, '1 hour', :restored_v);
SELECT version > :restored_v AS new_version FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a';
SELECT version AS a_v FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a' \gset
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 'b', 2, 2, '1 hour', :a_v);
SELECT version <> :a_v AS new_version FROM rl_override WHERE policy = 'ov.restored' AND subject = 'b';
-- An override brought back with its own limits keeps its version; with others it does not.
SELECT remaining FROM rl_consume('ov.restored', 'a', 2);
DELETE FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a';
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, version)
VALUES ('ov.restored', 'a', 2, 2, '1 hour', :a_v);
SELECT version = :a_v AS kept FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a';
SELECT allowed, remaining FROM rl_consume('ov.restored', 'a');
DELETE FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a';
INSERT INTO rl_override (policy, subject, action, version) VALUES ('ov.restored', 'a', 'allow', :a_v);
SELECT version > :a_v AS new_version FROM rl_override WHERE policy = 'ov.restored' AND subject = 'a';
-- A version the caller makes up (0, negative) is replaced.
INSERT INTO rl_override (policy, subject, action, version) VALUES ('ov.restored', 'c', 'deny', -5);
SELECT version > 0 AS issued FROM rl_override WHERE policy = 'ov.restored' AND subject = 'c';

--
-- Changes take effect at once in this session, and a rolled-back change is forgotten.
--
BEGIN;
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'flip', 'deny');
SELECT allowed, source FROM rl_consume('ov.api', 'flip');
ROLLBACK;
SELECT allowed, source FROM rl_consume('ov.api', 'flip');
BEGIN;
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'flip', 'deny');
SAVEPOINT s;
DELETE FROM rl_override WHERE subject = 'flip';
SELECT allowed, source FROM rl_consume('ov.api', 'flip');
ROLLBACK TO SAVEPOINT s;
SELECT allowed, source FROM rl_consume('ov.api', 'flip');
COMMIT;
SELECT allowed, source FROM rl_consume('ov.api', 'flip');
TRUNCATE rl_override;
SELECT allowed, source FROM rl_consume('ov.api', 'flip');

--
-- The history records every change of an override, with its policy and subject; deleting
-- a policy deletes (and records) its overrides.
--
SELECT max(id) AS hist_start FROM rl_policy_history \gset
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('ov.hist', 2, 2, '1 hour');
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period) VALUES ('ov.hist', 'h1', 4, 4, '1 hour');
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.hist', 'h2', 'deny'), ('ov.hist', 'h3', 'allow');
UPDATE rl_override SET capacity = 5, reason = 'more' WHERE policy = 'ov.hist' AND subject = 'h1';
DELETE FROM rl_override WHERE policy = 'ov.hist' AND subject = 'h3';
BEGIN;
DELETE FROM rl_override WHERE policy = 'ov.hist';
ROLLBACK;
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'h4', 'allow');
BEGIN;
TRUNCATE rl_override;
COMMIT;
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.hist', 'h5', 'deny');
DELETE FROM rl_policy WHERE name = 'ov.hist';
SELECT count(*) AS overrides_left FROM rl_override WHERE policy = 'ov.hist';
SELECT role, action, object, name, subject, old->>'action' AS old_action, new->>'action' AS new_action,
       old->>'capacity' AS old_capacity, new->>'capacity' AS new_capacity, new->>'reason' AS new_reason,
       (new->>'version')::int > (old->>'version')::int AS new_version,
       xid IS NOT NULL AND at IS NOT NULL AS stamped
FROM rl_policy_history WHERE id > :hist_start
ORDER BY xid, CASE WHEN action = 'TRUNCATE' THEN subject END, id;
-- The rows recorded are whole rows.
SELECT DISTINCT jsonb_object_keys(coalesce(new, old)) AS key
FROM rl_policy_history WHERE id > :hist_start AND object = 'override' ORDER BY 1;

--
-- Rights: rl_override is like rl_policy, nothing without a grant (see roles for a grant).
--
CREATE ROLE regress_override_nobody;
GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text) TO regress_override_nobody;
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'n1', 'deny');
SET ROLE regress_override_nobody;
SELECT expect_error($$SELECT * FROM rl_override$$);
SELECT expect_error($$INSERT INTO rl_override (policy, subject, action) VALUES ('ov.api', 'n1', 'allow')$$);
SELECT expect_error($$UPDATE rl_override SET action = 'allow'$$);
SELECT expect_error($$DELETE FROM rl_override$$);
SELECT expect_error($$TRUNCATE rl_override$$);
SELECT expect_error($$SELECT _rl_override_set_version()$$);
SELECT expect_error($$SELECT _rl_inserted_version('policy', 'ov.api', NULL, '{"version": 1}')$$);
-- Headers tell limits: no right to them without a grant.
SELECT expect_error($$SELECT rl_headers(ROW(true, 1, 5, 0, 0, 'ov.api', 1, 'redis', 0)::rl_decision)$$);
-- Deciding needs no right on rl_override, and the override still applies.
SELECT allowed, source FROM rl_consume('ov.api', 'n1');
RESET ROLE;
REVOKE ALL ON FUNCTION rl_consume(text, text, bigint, interval, text) FROM regress_override_nobody;
DROP ROLE regress_override_nobody;

-- While Redis cannot answer, an 'allow' check does not close its group.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
    ('ov.g_open', 5, 5, '1 hour', 'open'), ('ov.g_closed', 5, 5, '1 hour', 'closed');
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.g_closed', 'g3/vip', 'allow');
BEGIN;
SET LOCAL ratelimit.redis_url = 'redis://127.0.0.1:1';
SET LOCAL ratelimit.connect_timeout = '200ms';
SELECT allowed, source FROM rl_consume('ov.g_closed', 'g3/vip');
SELECT policy, allowed, source
FROM rl_consume_all(ARRAY['ov.g_open', 'ov.g_closed'], ARRAY['g3', 'g3/vip']);
COMMIT;

-- A statement trigger: an 'allow' or 'deny' subject is decided by its override whatever
-- its rows cost, even more than the capacity (no bucket is asked).
CREATE TABLE ov_items (tenant text, n bigint);
CREATE TRIGGER ov_items_limit AFTER INSERT ON ov_items
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('ov.g_closed', 'tenant', 'n');
INSERT INTO rl_override (policy, subject, action) VALUES ('ov.g_closed', 'g_deny', 'deny');
INSERT INTO ov_items VALUES ('g3/vip', 4), ('g3/vip', 4);
INSERT INTO ov_items VALUES ('g_deny', 4), ('g_deny', 4);
\echo :LAST_ERROR_SQLSTATE
INSERT INTO ov_items VALUES ('g_plain', 4), ('g_plain', 4);
\echo :LAST_ERROR_SQLSTATE
SELECT tenant, sum(n) FROM ov_items GROUP BY 1 ORDER BY 1;
DROP TABLE ov_items;
-- Checks decided without a bucket are not sent to Redis: a group of them asks nothing.
SELECT redis_calls AS calls_before FROM rl_stats WHERE policy = 'ov.g_closed' \gset
SELECT policy, allowed, source
FROM rl_consume_all(ARRAY['ov.g_closed', 'ov.g_closed'], ARRAY['g3/vip', 'g3/vip']);
SELECT redis_calls - :calls_before AS redis_calls_made FROM rl_stats WHERE policy = 'ov.g_closed';

DELETE FROM rl_policy WHERE name LIKE 'ov.%';
SELECT count(*) AS overrides_left FROM rl_override;
RESET ratelimit.test_clock_ms;
