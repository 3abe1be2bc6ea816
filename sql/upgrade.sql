-- The upgrade path: a database made with 0.1.0 keeps its policies, versions, history and
-- buckets through every update script up to the default version, and then has overrides.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SELECT count(*) AS paths_from_0_1_0_to_default
FROM pg_extension_update_paths('ratelimit') p
WHERE p.source = '0.1.0' AND p.path IS NOT NULL
  AND p.target = (SELECT default_version FROM pg_available_extensions WHERE name = 'ratelimit');
-- (Every later version is reachable from 0.1.0.)
SELECT count(*) AS unreachable_versions
FROM pg_extension_update_paths('ratelimit') p
WHERE p.source = '0.1.0' AND p.target <> '0.1.0' AND p.path IS NULL;

-- What a fresh install has, to compare the upgraded database with: every member object,
-- every column (with its position), constraint, trigger, index, function definition
-- (body, volatility, security, settings), view, sequence, comment and privilege. One item
-- per line (a definition's own line breaks are written as \n).
CREATE FUNCTION pg_temp.extension_shape() RETURNS text
LANGUAGE sql AS $$
WITH member AS (
    SELECT classid, objid FROM pg_depend
    WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
      AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'ratelimit')
), relation AS (
    SELECT objid AS oid FROM member WHERE classid = 'pg_class'::regclass
    UNION
    SELECT t.typrelid FROM member m JOIN pg_type t ON t.oid = m.objid
    WHERE m.classid = 'pg_type'::regclass AND t.typrelid <> 0
)
SELECT string_agg(item, E'\n' ORDER BY item) FROM (
    SELECT 'object ' || pg_describe_object(classid, objid, 0) AS item FROM member
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attnum || ' ' || a.attname || ' '
           || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.oid IN (SELECT oid FROM relation)
    UNION ALL
    SELECT 'constraint ' || conrelid::regclass || '.' || conname || ' '
           || replace(pg_get_constraintdef(oid), E'\n', '\n')
           || CASE WHEN convalidated THEN '' ELSE ' (not validated)' END
    FROM pg_constraint
    WHERE conrelid IN (SELECT oid FROM relation)
    UNION ALL
    SELECT 'trigger ' || tgrelid::regclass || '.' || tgname || ' ' || pg_get_triggerdef(oid)
    FROM pg_trigger
    WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM relation)
    UNION ALL
    SELECT 'index ' || pg_get_indexdef(indexrelid)
    FROM pg_index
    WHERE indrelid IN (SELECT oid FROM relation)
    UNION ALL
    SELECT 'function ' || replace(pg_get_functiondef(objid), E'\n', '\n')
    FROM member m JOIN pg_proc p ON p.oid = m.objid
    WHERE m.classid = 'pg_proc'::regclass
    UNION ALL
    SELECT 'view ' || objid::regclass::text || ' ' || replace(pg_get_viewdef(objid), E'\n', '\n')
    FROM member m JOIN pg_class c ON c.oid = m.objid
    WHERE m.classid = 'pg_class'::regclass AND c.relkind = 'v'
    UNION ALL
    SELECT 'sequence ' || seqrelid::regclass::text || ' ' || format_type(seqtypid, NULL)
           || ' start ' || seqstart || ' increment ' || seqincrement || ' min ' || seqmin
           || ' max ' || seqmax || ' cache ' || seqcache || CASE WHEN seqcycle THEN ' cycle' ELSE '' END
    FROM pg_sequence
    WHERE seqrelid IN (SELECT objid FROM member WHERE classid = 'pg_class'::regclass)
    UNION ALL
    SELECT 'comment ' || pg_describe_object(d.classoid, d.objoid, d.objsubid) || ': ' || d.description
    FROM pg_description d
    WHERE (d.classoid, d.objoid) IN (SELECT classid, objid FROM member)
       OR (d.classoid = 'pg_class'::regclass AND d.objoid IN (SELECT oid FROM relation))
    UNION ALL
    SELECT 'config ' || c::regclass::text
    FROM pg_extension, unnest(extconfig) AS c WHERE extname = 'ratelimit'
    UNION ALL
    SELECT 'acl ' || p.oid::regprocedure::text || ' ' || coalesce(p.proacl::text, 'default')
    FROM pg_proc p
    WHERE p.oid IN (SELECT objid FROM member WHERE classid = 'pg_proc'::regclass)
    UNION ALL
    SELECT 'acl ' || c.oid::regclass::text || ' ' || coalesce(c.relacl::text, 'default')
    FROM pg_class c
    WHERE c.oid IN (SELECT objid FROM member WHERE classid = 'pg_class'::regclass)
) AS shape
$$;
SELECT pg_temp.extension_shape() AS fresh_shape,
       (SELECT prosrc FROM pg_proc WHERE oid = 'pg_temp.extension_shape'::regproc) AS shape_body \gset
-- What the comparison covers, by kind.
SELECT split_part(item, ' ', 1) AS kind, count(*) AS items
FROM unnest(string_to_array(:'fresh_shape', E'\n')) AS item GROUP BY 1 ORDER BY 1;

CREATE DATABASE regress_upgrade;
\c regress_upgrade
SET ratelimit.test_clock_ms = '2900000000000';
CREATE EXTENSION ratelimit VERSION '0.1.0';
CREATE FUNCTION pg_temp.extension_shape() RETURNS text LANGUAGE sql AS :'shape_body';
SELECT extversion, to_regclass('rl_override') IS NULL AS no_overrides_yet
FROM pg_extension WHERE extname = 'ratelimit';

-- Policies made with 0.1.0: one changed (a new version), one changed in a way that keeps
-- it, one deleted.
SELECT name, capacity, version FROM rl_define('up.api', 10, '1 hour');
SELECT name, capacity, version FROM rl_define('up.read', 100, '1 minute');
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('up.lease', 'concurrency', 2, '1 minute');
SELECT name, capacity, version FROM rl_define('up.gone', 1, '1 second');
UPDATE rl_policy SET capacity = 20 WHERE name = 'up.api';
UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'up.read';
DELETE FROM rl_policy WHERE name = 'up.gone';
-- The library that is installed now works with the 0.1.0 objects.
SELECT allowed, remaining, capacity, version, source FROM rl_consume('up.api', 'tenant_a', 7);
SELECT allowed, remaining, capacity, version, source FROM rl_consume('up.read', 'tenant_a/u1', 30);
SELECT policy, allowed, remaining, version, source
FROM rl_consume_all(ARRAY['up.api', 'up.read'], ARRAY['tenant_a', 'tenant_a/u2'], ARRAY[1, 40]);
SELECT allowed, remaining, version, source FROM rl_peek('up.lease', 'tenant_a');

-- What must survive the upgrade.
CREATE TABLE before_policy AS SELECT * FROM rl_policy;
CREATE TABLE before_history AS SELECT * FROM rl_policy_history;
SELECT last_value AS version_before, (SELECT max(id) FROM rl_policy_history) AS history_before
FROM rl_policy_version_seq \gset
SELECT name, capacity, fail_mode, version FROM before_policy ORDER BY name;
SELECT id, action, name, old->>'version' AS old_version, new->>'version' AS new_version
FROM before_history ORDER BY id;

-- Every step of the path from 0.1.0 to the default version, in order.
DO $$
DECLARE
    steps text[];
    reached text;
BEGIN
    SELECT string_to_array(p.path, '--') INTO steps
    FROM pg_extension_update_paths('ratelimit') p
    WHERE p.source = '0.1.0'
      AND p.target = (SELECT default_version FROM pg_available_extensions WHERE name = 'ratelimit');
    IF steps IS NULL THEN
        RAISE EXCEPTION 'no update path from 0.1.0 to the default version';
    END IF;
    FOR i IN 2 .. array_length(steps, 1) LOOP
        EXECUTE format('ALTER EXTENSION ratelimit UPDATE TO %L', steps[i]);
        SELECT extversion INTO reached FROM pg_extension WHERE extname = 'ratelimit';
        IF reached <> steps[i] THEN
            RAISE EXCEPTION 'ALTER EXTENSION ratelimit UPDATE TO % reached %', steps[i], reached;
        END IF;
    END LOOP;
END
$$;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'ratelimit')
       AS at_default_version
FROM pg_extension WHERE extname = 'ratelimit';
-- The upgraded database has what a fresh install has.
SELECT pg_temp.extension_shape() = :'fresh_shape' AS same_as_fresh_install;
SELECT item AS only_in_fresh_install
FROM unnest(string_to_array(:'fresh_shape', E'\n')) AS item
EXCEPT SELECT unnest(string_to_array(pg_temp.extension_shape(), E'\n')) ORDER BY 1;
SELECT item AS only_after_upgrade
FROM unnest(string_to_array(pg_temp.extension_shape(), E'\n')) AS item
EXCEPT SELECT unnest(string_to_array(:'fresh_shape', E'\n')) ORDER BY 1;

-- Every policy row, with its version, and every history row are kept; the upgrade
-- itself changed nothing that is recorded.
SELECT name, capacity, fail_mode, version FROM rl_policy ORDER BY name;
SELECT b.name, to_jsonb(b) <@ to_jsonb(p) AS row_kept
FROM before_policy b LEFT JOIN rl_policy p ON p.name = b.name ORDER BY 1;
SELECT count(*) AS policies FROM rl_policy;
SELECT b.id, h.id IS NOT NULL AS kept, h.object, h.subject
FROM before_history b
LEFT JOIN rl_policy_history h
  ON (h.id, h.at, h.role, h.xid, h.action, h.name) = (b.id, b.at, b.role, b.xid, b.action, b.name)
 AND h.old IS NOT DISTINCT FROM b.old AND h.new IS NOT DISTINCT FROM b.new
ORDER BY b.id;
SELECT count(*) AS history_rows FROM rl_policy_history;
SELECT last_value = :version_before AS version_counter_kept FROM rl_policy_version_seq;

-- The buckets are kept: the same keys, and tokens go on from where they were.
SELECT allowed, remaining, capacity, version, source FROM rl_consume('up.api', 'tenant_a');
SELECT allowed, remaining, capacity, version, source FROM rl_peek('up.read', 'tenant_a/u1');
SELECT allowed, remaining, capacity, version, source FROM rl_peek('up.read', 'tenant_a/u2');

-- Overrides work.
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
VALUES ('up.api', 'tenant_b', 50, 50, '1 hour');
INSERT INTO rl_override (policy, subject, action) VALUES
    ('up.api', 'tenant_a', 'deny'),
    ('up.read', 'tenant_a/u1', 'allow');
INSERT INTO rl_override (policy, subject, capacity) VALUES ('up.lease', 'tenant_a', 5);
SELECT policy, subject, action, version > :version_before AS new_version FROM rl_override ORDER BY 1, 2;
SELECT allowed, remaining, capacity, version > :version_before AS override_version, source
FROM rl_consume('up.api', 'tenant_b', 30);
SELECT allowed, remaining, retry_after_ms, source FROM rl_consume('up.api', 'tenant_a');
SELECT allowed, remaining, source FROM rl_consume('up.read', 'tenant_a/u1', 100);
SELECT allowed, remaining, capacity, source FROM rl_peek('up.lease', 'tenant_a');
SELECT policy, allowed, source
FROM rl_consume_all(ARRAY['up.read', 'up.api'], ARRAY['tenant_a/u3', 'tenant_a']);
SELECT allowed, remaining FROM rl_peek('up.read', 'tenant_a/u3');
-- Lifting the deny returns tenant_a to its old bucket.
DELETE FROM rl_override WHERE subject = 'tenant_a' AND policy = 'up.api';
SELECT allowed, remaining, capacity, version, source FROM rl_consume('up.api', 'tenant_a');

-- New versions continue above the old ones; new history rows come after the old ones
-- and record overrides.
SELECT name, version > :version_before AS newer FROM rl_define('up.new', 5, '1 hour');
UPDATE rl_policy SET capacity = 30 WHERE name = 'up.api';
SELECT version > :version_before AS newer FROM rl_policy WHERE name = 'up.api';
SELECT allowed, remaining, capacity, source FROM rl_consume('up.api', 'tenant_a');
SELECT h.action, h.object, h.name, h.subject, h.id > :history_before AS after_the_old_rows
FROM rl_policy_history h
WHERE NOT EXISTS (SELECT FROM before_history b WHERE b.id = h.id AND b.xid = h.xid)
ORDER BY h.id;
-- A policy can be deleted with its overrides, and the extension dropped.
DELETE FROM rl_policy WHERE name = 'up.api';
SELECT count(*) AS overrides_of_up_api FROM rl_override WHERE policy = 'up.api';
DROP EXTENSION ratelimit;

\c contrib_regression
DROP DATABASE regress_upgrade;

-- 0.3.0 -> 0.4.0: history ids that an earlier restore made repeat become unique, the
-- restore's copy (the later one) renumbered after all others; an installation with
-- policies keeps id 0 (its keys), one without gets an id of its own.
CREATE DATABASE regress_upgrade_ids;
\c regress_upgrade_ids
CREATE EXTENSION ratelimit VERSION '0.3.0';
SELECT name FROM rl_define('ids.a', 10, '1 hour');
SELECT name FROM rl_define('ids.b', 10, '1 hour');
-- What a 0.3.0 restore left: the restore's own record of ids.a, with an id already taken.
INSERT INTO rl_policy_history (id, at, role, action, object, name, new)
SELECT 1, at + interval '1 hour', 'restorer', 'INSERT', 'policy', 'ids.a', new
FROM rl_policy_history WHERE id = 1;
SELECT count(*) - count(DISTINCT id) AS repeated_ids_before FROM rl_policy_history;
ALTER EXTENSION ratelimit UPDATE TO '0.4.0';
SELECT count(*) - count(DISTINCT id) AS repeated_ids_after FROM rl_policy_history;
SELECT role, id = (SELECT max(id) FROM rl_policy_history) AS renumbered_last
FROM rl_policy_history WHERE role = 'restorer';
SELECT last_value = 0 AS keeps_its_keys FROM rl_installation_seq;
DO $$
BEGIN
    INSERT INTO rl_policy_history (id, role, action, name) VALUES (1, 'x', 'INSERT', 'x');
    RAISE NOTICE 'a repeated id was accepted';
EXCEPTION WHEN unique_violation THEN
    RAISE NOTICE 'a repeated id is refused (23505)';
END
$$;
\c contrib_regression
DROP DATABASE regress_upgrade_ids;
CREATE DATABASE regress_upgrade_empty;
\c regress_upgrade_empty
CREATE EXTENSION ratelimit VERSION '0.3.0';
ALTER EXTENSION ratelimit UPDATE TO '0.4.0';
SELECT last_value > 0 AS an_id_of_its_own FROM rl_installation_seq;
\c contrib_regression
DROP DATABASE regress_upgrade_empty;

-- 0.9.0 -> 0.10.0 makes rl_consume, rl_reserve, rl_define ... and the view rl_stats again:
-- what roles were granted on them is granted on the new ones, a REVOKE from PUBLIC is kept,
-- and those grants stay the roles' (not in pg_init_privs, so that pg_dump keeps them).
CREATE DATABASE regress_upgrade_grants;
\c regress_upgrade_grants
CREATE EXTENSION ratelimit VERSION '0.9.0';
CREATE ROLE regress_upgrade_app;
GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint) TO regress_upgrade_app;
GRANT EXECUTE ON FUNCTION rl_reserve(text, text, bigint) TO regress_upgrade_app WITH GRANT OPTION;
GRANT SELECT ON rl_stats TO regress_upgrade_app;
REVOKE EXECUTE ON FUNCTION rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval) FROM PUBLIC;
ALTER EXTENSION ratelimit UPDATE TO '0.10.0';
SELECT has_function_privilege('regress_upgrade_app', 'rl_consume(text, text, bigint, interval, text)', 'EXECUTE') AS consume,
       has_function_privilege('regress_upgrade_app', 'rl_reserve(text, text, bigint, interval, text)',
                              'EXECUTE WITH GRANT OPTION') AS reserve_grantable,
       has_function_privilege('regress_upgrade_app', 'rl_enforce(text, text, bigint, interval, text)', 'EXECUTE') AS enforce,
       has_table_privilege('regress_upgrade_app', 'rl_stats', 'SELECT') AS stats,
       has_table_privilege('pg_monitor', 'rl_stats', 'SELECT') AS stats_monitor,
       has_function_privilege('public',
           'rl_define(text, bigint, interval, bigint, text, interval, numeric, text, text, bigint, interval, bigint, interval)',
           'EXECUTE') AS define_public;
SELECT count(*) AS app_in_init_privs
FROM pg_init_privs i, aclexplode(i.initprivs) a
WHERE a.grantee = 'regress_upgrade_app'::regrole;
\c contrib_regression
DROP DATABASE regress_upgrade_grants;
DROP ROLE regress_upgrade_app;
