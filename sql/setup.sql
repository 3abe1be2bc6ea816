-- Installs the extension. (Every file, this one apart, loads sql/include/fixtures.sql
-- first: the extension if it is missing and the helper expect_error, so each runs alone.)
CREATE EXTENSION ratelimit;

SELECT e.extname, e.extversion, n.nspname
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = 'ratelimit';

-- Every object the contract names, and nothing callable by PUBLIC that spends budget.
SELECT pg_describe_object(classid, objid, 0) AS object
FROM pg_depend
WHERE refclassid = 'pg_extension'::regclass
  AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'ratelimit')
ORDER BY 1;

SELECT proname, has_function_privilege('public', p.oid, 'EXECUTE') AS public_may_execute
FROM pg_proc p
WHERE proname IN ('rl_consume', 'rl_enforce', 'rl_reserve', 'rl_peek', 'rl_refund', 'rl_reset',
                  'rl_acquire', 'rl_release', 'rl_consume_all', 'rl_limit_trigger',
                  'rl_health', '_rl_local_available',
                  '_rl_policy_set_version', '_rl_policy_invalidate')
ORDER BY 1;
