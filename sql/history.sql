-- Managing policies: rl_define reads like the requirement; every change is in the history.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

TRUNCATE rl_policy_history;
SELECT name, capacity, refill_amount, refill_period, fail_mode, local_share
FROM rl_define('hist.write', 120, per => '1 minute', burst => 200, fail_mode => 'closed');
-- A change keeps what it does not name; a new meaning means a new version.
CREATE TEMP TABLE v AS SELECT version FROM rl_policy WHERE name = 'hist.write';
SELECT name, capacity, refill_amount, refill_period, fail_mode, version > (SELECT version FROM v) AS new_version
FROM rl_define('hist.write', 60, per => '1 minute');
SELECT name, capacity, fail_mode, local_share FROM rl_define('hist.read', 1000, '1 second', fail_mode => 'open', local_share => 0.5);
-- rl_define goes through the same constraints as an INSERT or UPDATE.
SELECT expect_error($$SELECT rl_define('hist.bad', 0, '1 minute')$$);
SELECT expect_error($$SELECT rl_define('Hist.Bad', 10, '1 minute')$$);
SELECT expect_error($$SELECT rl_define('hist.write', 10, '1 month')$$);
SELECT expect_error($$SELECT rl_define('hist.write', 10, '1 minute', fail_mode => 'maybe')$$);

-- Plain statements are recorded too, TRUNCATE row by row.
UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'hist.write';
DELETE FROM rl_policy WHERE name = 'hist.read';
CREATE ROLE regress_hist_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON rl_policy TO regress_hist_admin;
SET ROLE regress_hist_admin;
SELECT name, capacity FROM rl_define('hist.admin', 5, '1 hour');
-- The history is written by the extension only; an administrator cannot touch it.
SELECT expect_error($$SELECT * FROM rl_policy_history$$);
SELECT expect_error($$INSERT INTO rl_policy_history (role, action, name) VALUES ('x', 'INSERT', 'x')$$);
SELECT expect_error($$DELETE FROM rl_policy_history$$);
RESET ROLE;
BEGIN;
DELETE FROM rl_policy WHERE name NOT LIKE 'hist.%';
TRUNCATE rl_policy CASCADE;
ROLLBACK;
DELETE FROM rl_policy WHERE name = 'hist.admin';

SELECT role, action, name, old->>'capacity' AS old_capacity, new->>'capacity' AS new_capacity,
       old->>'fail_mode' AS old_fail_mode, new->>'fail_mode' AS new_fail_mode,
       xid IS NOT NULL AND at IS NOT NULL AS stamped
FROM rl_policy_history ORDER BY id;
-- (The rolled-back DELETE and TRUNCATE above left no trace.) One transaction's changes
-- share its xid.
BEGIN;
SELECT name FROM rl_define('hist.pair.a', 1, '1 s');
SELECT name FROM rl_define('hist.pair.b', 1, '1 s');
COMMIT;
SELECT count(*) AS changes, count(DISTINCT xid) AS transactions
FROM rl_policy_history WHERE name LIKE 'hist.pair.%';

REVOKE ALL ON rl_policy FROM regress_hist_admin;
DROP ROLE regress_hist_admin;
DELETE FROM rl_policy WHERE name LIKE 'hist.%';
