-- Subjects: any text up to 1024 bytes; odd text can never reach into another bucket.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2000000000000';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('login', 2, 1, '1 hour');

-- Drain 'tenant', then show that look-alikes have their own full buckets.
SELECT allowed, remaining FROM rl_consume('login', 'tenant', 2);
SELECT s AS subject, allowed, remaining
FROM unnest(ARRAY['{tenant}', 'tenant}', '{tenant', 'Tenant', 'tenant:login', 'tenant ', ' tenant',
                  'x}:login', 'tenant}:login:{x', '#tenant']) AS s,
     LATERAL rl_consume('login', s, 1);

-- E-mails, tokens and non-ASCII text are hashed, each a bucket of its own.
SELECT allowed, remaining FROM rl_consume('login', 'alice@example.com', 2);
SELECT allowed, remaining FROM rl_consume('login', 'alice@example.com', 1);
SELECT allowed, remaining FROM rl_consume('login', 'bob@example.com', 1);
SELECT allowed, remaining FROM rl_consume('login', 'Ünïcødé', 1);
SELECT allowed, remaining FROM rl_consume('login', E'tab\there', 1);
-- 64 bytes of safe id are kept as is, 65 are hashed: still different buckets.
SELECT allowed, remaining FROM rl_consume('login', repeat('a', 64), 2);
SELECT allowed, remaining FROM rl_consume('login', repeat('a', 65), 2);
SELECT allowed, remaining FROM rl_consume('login', repeat('a', 64), 1);

-- A new subject secret means new buckets for hashed subjects (and only for them).
SET ratelimit.subject_secret = 'another secret';
SELECT allowed, remaining FROM rl_consume('login', 'alice@example.com', 1);
SELECT allowed, remaining FROM rl_consume('login', 'tenant', 1);
RESET ratelimit.subject_secret;
SELECT allowed, remaining FROM rl_consume('login', 'alice@example.com', 1);

-- Another key scope is another set of buckets.
SET ratelimit.key_scope = 'staging';
SELECT allowed, remaining FROM rl_consume('login', 'tenant', 1);
RESET ratelimit.key_scope;
SELECT allowed, remaining FROM rl_consume('login', 'tenant', 1);

DELETE FROM rl_policy WHERE name = 'login';
