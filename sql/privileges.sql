-- Privileges: spending budget, changing policies and reading secrets are separate rights.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql
-- The README's policy, made anew for this file: a version (so buckets) of its own.
DELETE FROM rl_policy WHERE name = 'reports.export';
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');

SET ratelimit.test_clock_ms = '2100000000000';
CREATE ROLE regress_app;
CREATE ROLE regress_policy_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON rl_policy TO regress_policy_admin;

SET ROLE regress_app;
-- No EXECUTE until granted.
SELECT expect_error($$SELECT rl_consume('reports.export', 'tenant_p')$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_enforce(text, text, bigint, interval, text) TO regress_app;
SET ROLE regress_app;
-- Deciding needs no right on the policy table.
SELECT allowed, remaining, source FROM rl_consume('reports.export', 'tenant_p');
-- Policies: not readable, not writable.
SELECT expect_error($$SELECT * FROM rl_policy$$);
SELECT expect_error($$INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('mine', 1000000, 1, '1 s')$$);
SELECT expect_error($$UPDATE rl_policy SET capacity = 1000000$$);
SELECT expect_error($$DELETE FROM rl_policy$$);
SELECT expect_error($$TRUNCATE rl_policy$$);
-- Secrets and anything that picks a bucket or a time: superuser only.
SELECT expect_error($$SHOW ratelimit.redis_url$$);
SELECT expect_error($$SELECT current_setting('ratelimit.redis_url')$$);
SELECT count(*) AS url_rows_with_value FROM pg_settings
WHERE name IN ('ratelimit.redis_url', 'ratelimit.subject_secret') AND setting IS NOT NULL;
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:6379'$$);
SELECT expect_error($$SET ratelimit.subject_secret = 'x'$$);
SELECT expect_error($$SET ratelimit.key_prefix = 'mine'$$);
SELECT expect_error($$SET ratelimit.key_scope = 'mine'$$);
SELECT expect_error($$SET ratelimit.test_clock_ms = '1'$$);
-- Deadlines are the caller's own choice.
SET ratelimit.command_timeout = '100ms';
SET ratelimit.connect_timeout = '200ms';
SELECT allowed, source FROM rl_consume('reports.export', 'tenant_p');
RESET ROLE;

-- A policy administrator need not be superuser; versions still come from the extension.
SET ROLE regress_policy_admin;
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
VALUES ('admin.made', 3, 1, '1 s', 99999);
SELECT version < 99999 AS version_from_extension FROM rl_policy WHERE name = 'admin.made';

-- Nobody can borrow the version trigger (SECURITY DEFINER) for a table of their own.
RESET ROLE;
SET ROLE regress_app;
CREATE TEMP TABLE borrowed (name text, algorithm text, capacity bigint, refill_amount bigint,
    refill_period interval, idle_ttl interval, fail_mode text, version integer);
SELECT expect_error($$CREATE TRIGGER t BEFORE INSERT ON borrowed FOR EACH ROW EXECUTE FUNCTION public._rl_policy_set_version()$$);
DROP TABLE borrowed;
RESET ROLE;
CREATE TEMP TABLE borrowed (LIKE public.rl_policy);
CREATE TRIGGER t BEFORE INSERT ON borrowed FOR EACH ROW EXECUTE FUNCTION public._rl_policy_set_version();
SELECT expect_error($$INSERT INTO borrowed VALUES ('x', 'token_bucket', 1, 1, '1 s', NULL, 'open', 1)$$);
DROP TABLE borrowed;

-- search_path tricks: look-alike functions and tables in a schema searched first.
RESET ROLE;
CREATE SCHEMA regress_evil;
GRANT USAGE ON SCHEMA regress_evil TO PUBLIC;
CREATE FUNCTION regress_evil.gcd(numeric, numeric) RETURNS numeric LANGUAGE sql AS 'SELECT 1::numeric';
CREATE FUNCTION regress_evil.nextval(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 99999::bigint';
CREATE TABLE regress_evil.rl_policy (LIKE public.rl_policy);
INSERT INTO regress_evil.rl_policy
    (name, algorithm, capacity, refill_amount, refill_period, fail_mode, mode, local_share, version, time_zone, deny_cache,
     allowance_ttl, replay_window)
VALUES ('reports.export', 'token_bucket', 1000000, 1, '1 s', 'open', 'enforce', 1, 1, 'UTC', true, '1 s', '1 hour');
GRANT SELECT ON regress_evil.rl_policy TO PUBLIC;
SET ROLE regress_policy_admin;
SET search_path = regress_evil, pg_catalog, public;
-- Still the real bound check and the real version sequence.
SELECT expect_error($$INSERT INTO public.rl_policy (name, capacity, refill_amount, refill_period) VALUES ('evil.huge', 9007199254740992, 1, '1 ms')$$);
INSERT INTO public.rl_policy (name, capacity, refill_amount, refill_period) VALUES ('evil.small', 1, 1, '1 s');
SELECT version < 99999 AS version_from_extension FROM public.rl_policy WHERE name = 'evil.small';
RESET ROLE;
SET ROLE regress_app;
SET search_path = regress_evil, pg_catalog, public;
-- Still the extension's own policy table (capacity 5, not the look-alike's million).
SELECT allowed, capacity FROM public.rl_consume('reports.export', 'tenant_evil', 5);
RESET search_path;
RESET ROLE;

DROP SCHEMA regress_evil CASCADE;
DELETE FROM rl_policy WHERE name IN ('admin.made', 'evil.small');
REVOKE ALL ON rl_policy FROM regress_policy_admin;
REVOKE ALL ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_enforce(text, text, bigint, interval, text) FROM regress_app;
DROP ROLE regress_app;
DROP ROLE regress_policy_admin;

DELETE FROM rl_policy WHERE name = 'reports.export';
