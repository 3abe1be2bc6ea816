-- The privilege model, as docs/operations.md's recipe: one group role administers policies, one
-- only spends budget. Neither needs to be superuser.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

CREATE ROLE regress_ratelimit_admin NOLOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON rl_policy, rl_override TO regress_ratelimit_admin;
GRANT SELECT ON rl_policy_history TO regress_ratelimit_admin;
GRANT EXECUTE ON FUNCTION rl_refund(text, text, bigint), rl_reset(text, text),
                          rl_peek(text, text, bigint), rl_usage(text, text),
                          rl_usage(text, text[]) TO regress_ratelimit_admin;
GRANT pg_monitor TO regress_ratelimit_admin;
CREATE ROLE regress_ratelimit_user NOLOGIN;
GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_enforce(text, text, bigint, interval, text),
                          rl_reserve(text, text, bigint, interval, text), rl_peek(text, text, bigint),
                          rl_acquire(text, text, text, interval), rl_release(text, text),
                          rl_consume_all(text[], text[], bigint[], text),
                          rl_headers(rl_decision, boolean),
                          rl_response_headers(rl_decision, boolean) TO regress_ratelimit_user;
CREATE ROLE regress_ops IN ROLE regress_ratelimit_admin;
CREATE ROLE regress_app IN ROLE regress_ratelimit_user;
SET ratelimit.test_clock_ms = '2700000000000';

-- The administrator defines and changes policies and reads their history.
SET ROLE regress_ops;
SELECT name, capacity FROM rl_define('roles.api', 3, '1 minute');
SELECT count(*) >= 0 AS reads_stats FROM rl_stats;
UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'roles.api';
-- ... and the subjects' overrides; a version it brings is replaced by the extension's.
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, reason, version)
VALUES ('roles.api', 'r2', 1, 1, '1 minute', 'tight', 1);
INSERT INTO rl_override (policy, subject, action) VALUES ('roles.api', 'r3', 'deny');
UPDATE rl_override SET reason = 'abuse' WHERE policy = 'roles.api' AND subject = 'r3';
SELECT subject, action, capacity, version > (SELECT version FROM rl_policy WHERE name = 'roles.api') AS own_version
FROM rl_override WHERE policy = 'roles.api' ORDER BY subject;
SELECT role, action, object, name, subject FROM rl_policy_history WHERE name = 'roles.api' ORDER BY id;
SELECT expect_error($$DELETE FROM rl_policy_history$$);
SELECT expect_error($$SELECT rl_consume('roles.api', 'r1')$$);
RESET ROLE;

-- The application spends budget and touches nothing else.
SET ROLE regress_app;
SELECT allowed, remaining FROM rl_consume('roles.api', 'r1');
SELECT allowed, remaining FROM rl_peek('roles.api', 'r1');
-- It tells its clients with headers, and cannot read the statistics or reset them.
SELECT rl_headers(d) FROM rl_peek('roles.api', 'r1') d;
BEGIN;
SELECT allowed FROM rl_response_headers(rl_consume('roles.api', 'r4'));
SELECT string_agg(k, ', ' ORDER BY k) AS headers_set
FROM jsonb_array_elements(current_setting('response.headers')::jsonb) e, jsonb_object_keys(e) k;
COMMIT;
SELECT expect_error($$SELECT * FROM rl_stats$$);
SELECT expect_error($$SELECT rl_stats_reset()$$);
-- Nor who is limited, nor anyone's usage.
SELECT expect_error($$SELECT * FROM rl_top('roles.api')$$);
SELECT expect_error($$SELECT * FROM rl_usage('roles.api', 'r1')$$);
-- Overrides apply to it without any right on rl_override.
SELECT allowed, remaining, capacity, source FROM rl_consume('roles.api', 'r2');
SELECT allowed, remaining, capacity, source FROM rl_consume('roles.api', 'r2');
SELECT allowed, source FROM rl_consume('roles.api', 'r3');
SELECT expect_error($$SELECT * FROM rl_policy$$);
SELECT expect_error($$SELECT * FROM rl_override$$);
SELECT expect_error($$INSERT INTO rl_override (policy, subject, action) VALUES ('roles.api', 'r1', 'allow')$$);
SELECT expect_error($$UPDATE rl_override SET action = 'allow', capacity = NULL, refill_amount = NULL, refill_period = NULL$$);
SELECT expect_error($$DELETE FROM rl_override$$);
SELECT expect_error($$SELECT rl_define('roles.mine', 1000000, '1 second')$$);
SELECT expect_error($$UPDATE rl_policy SET capacity = 1000000$$);
SELECT expect_error($$SELECT * FROM rl_policy_history$$);
SELECT expect_error($$SELECT rl_refund('roles.api', 'r1', 1)$$);
SELECT expect_error($$SELECT rl_reset('roles.api', 'r1')$$);
RESET ROLE;

-- The administrator sees who is limited (the subjects: it may read rl_override) and how
-- close a subject is to its limit.
SET ROLE regress_ops;
SELECT kind, subject, count, error FROM rl_top('roles.api') ORDER BY kind, count DESC, subject;
SELECT used, "limit", fraction, source FROM rl_usage('roles.api', 'r1');
SELECT subject, used, "limit" FROM rl_usage('roles.api', ARRAY['r1', 'r2', 'nobody']);
RESET ROLE;

-- The administrator gives budget back.
SET ROLE regress_ops;
SELECT allowed, remaining FROM rl_refund('roles.api', 'r1', 1);
-- ... and lifts an override.
DELETE FROM rl_override WHERE policy = 'roles.api' AND subject = 'r3';
RESET ROLE;
SET ROLE regress_app;
SELECT allowed, source FROM rl_consume('roles.api', 'r3');
RESET ROLE;

DELETE FROM rl_policy WHERE name = 'roles.api';
DROP ROLE regress_ops, regress_app;
REVOKE ALL ON rl_policy, rl_override, rl_policy_history FROM regress_ratelimit_admin;
REVOKE ALL ON FUNCTION rl_refund(text, text, bigint), rl_reset(text, text),
                       rl_peek(text, text, bigint), rl_usage(text, text),
                       rl_usage(text, text[]) FROM regress_ratelimit_admin;
REVOKE ALL ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_enforce(text, text, bigint, interval, text),
                       rl_reserve(text, text, bigint, interval, text), rl_peek(text, text, bigint),
                       rl_acquire(text, text, text, interval), rl_release(text, text),
                       rl_consume_all(text[], text[], bigint[], text),
                       rl_headers(rl_decision, boolean),
                       rl_response_headers(rl_decision, boolean) FROM regress_ratelimit_user;
REVOKE pg_monitor FROM regress_ratelimit_admin;
DROP ROLE regress_ratelimit_admin, regress_ratelimit_user;
