-- The privilege model, as the README's recipe: one group role administers policies, one
-- only spends budget. Neither needs to be superuser.
CREATE ROLE regress_ratelimit_admin NOLOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON rl_policy TO regress_ratelimit_admin;
GRANT SELECT ON rl_policy_history TO regress_ratelimit_admin;
GRANT EXECUTE ON FUNCTION rl_refund(text, text, bigint), rl_reset(text, text),
                          rl_peek(text, text, bigint) TO regress_ratelimit_admin;
CREATE ROLE regress_ratelimit_user NOLOGIN;
GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint), rl_enforce(text, text, bigint),
                          rl_reserve(text, text, bigint), rl_peek(text, text, bigint),
                          rl_acquire(text, text, text), rl_release(text, text),
                          rl_consume_all(text[], text[], bigint[]) TO regress_ratelimit_user;
CREATE ROLE regress_ops IN ROLE regress_ratelimit_admin;
CREATE ROLE regress_app IN ROLE regress_ratelimit_user;
SET ratelimit.test_clock_ms = '2700000000000';

-- The administrator defines and changes policies and reads their history.
SET ROLE regress_ops;
SELECT name, capacity FROM rl_define('roles.api', 3, '1 minute');
UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'roles.api';
SELECT role, action, name FROM rl_policy_history WHERE name = 'roles.api' ORDER BY id;
SELECT expect_error($$DELETE FROM rl_policy_history$$);
SELECT expect_error($$SELECT rl_consume('roles.api', 'r1')$$);
RESET ROLE;

-- The application spends budget and touches nothing else.
SET ROLE regress_app;
SELECT allowed, remaining FROM rl_consume('roles.api', 'r1');
SELECT allowed, remaining FROM rl_peek('roles.api', 'r1');
SELECT expect_error($$SELECT * FROM rl_policy$$);
SELECT expect_error($$SELECT rl_define('roles.mine', 1000000, '1 second')$$);
SELECT expect_error($$UPDATE rl_policy SET capacity = 1000000$$);
SELECT expect_error($$SELECT * FROM rl_policy_history$$);
SELECT expect_error($$SELECT rl_refund('roles.api', 'r1', 1)$$);
SELECT expect_error($$SELECT rl_reset('roles.api', 'r1')$$);
RESET ROLE;

-- The administrator gives budget back.
SET ROLE regress_ops;
SELECT allowed, remaining FROM rl_refund('roles.api', 'r1', 1);
RESET ROLE;

DELETE FROM rl_policy WHERE name = 'roles.api';
DROP ROLE regress_ops, regress_app;
REVOKE ALL ON rl_policy, rl_policy_history FROM regress_ratelimit_admin;
REVOKE ALL ON FUNCTION rl_refund(text, text, bigint), rl_reset(text, text),
                       rl_peek(text, text, bigint) FROM regress_ratelimit_admin;
REVOKE ALL ON FUNCTION rl_consume(text, text, bigint), rl_enforce(text, text, bigint),
                       rl_reserve(text, text, bigint), rl_peek(text, text, bigint),
                       rl_acquire(text, text, text), rl_release(text, text),
                       rl_consume_all(text[], text[], bigint[]) FROM regress_ratelimit_user;
DROP ROLE regress_ratelimit_admin, regress_ratelimit_user;
