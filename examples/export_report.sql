-- The README's worked example: a procedure that reserves budget before an expensive export.
\set ON_ERROR_STOP on
\set VERBOSITY terse
SET client_min_messages = notice;

CREATE EXTENSION IF NOT EXISTS ratelimit;

-- 5 tokens of burst, 100 an hour; an export costs 5. Redis down means no exports.
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
VALUES ('reports.export', 5, 100, '1 hour', 'closed');

CREATE TABLE report_exports (tenant text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());

CREATE PROCEDURE export_report(tenant text)
LANGUAGE plpgsql AS $$
DECLARE
    decision rl_decision;
BEGIN
    -- Reserve the budget first: a denial raises SQLSTATE RL429 and nothing below runs.
    decision := rl_enforce('reports.export', tenant, 5);
    -- ... the expensive export would run here ...
    INSERT INTO report_exports (tenant) VALUES (tenant);
    RAISE NOTICE 'export for % granted (% tokens left, decided by %)',
        tenant, decision.remaining, decision.source;
END
$$;

-- A caller that turns a denial into a message (an API would answer 429 with Retry-After).
CREATE PROCEDURE try_export(tenant text)
LANGUAGE plpgsql AS $$
DECLARE
    detail text;
BEGIN
    CALL export_report(tenant);
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
    RAISE NOTICE 'export for % denied: % %', tenant, SQLERRM, detail;
END
$$;

CALL try_export('tenant_7f2');
CALL try_export('tenant_7f2');
-- Another tenant has its own budget.
CALL try_export('tenant_9b1');
-- The decision without the error, as a row.
SELECT * FROM rl_consume('reports.export', 'tenant_7f2', 5);

-- A premium tenant gets twice the burst: an override, with its own bucket.
INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, reason)
VALUES ('reports.export', 'tenant_vip', 10, 200, '1 hour', 'enterprise plan');
CALL try_export('tenant_vip');
CALL try_export('tenant_vip');

-- What an HTTP API would send with a denial: 429 and these headers.
SELECT rl_headers(d) AS headers FROM rl_consume('reports.export', 'tenant_9b1', 5) d;

-- What the limiter did, per policy (no subject in it).
SELECT policy, decisions, allowed, denied, tokens_granted, source_redis, redis_calls
FROM rl_stats;
