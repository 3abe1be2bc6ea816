-- Observability: rl_stats (per-policy counters since the last rl_stats_reset(), never a
-- subject), the decision log (a LOG line per chosen decision with a keyed hash for the
-- subject, never the subject) and who may see or change them. The clock does not move
-- unless a test moves it; the subject secret is fixed, so the hashes below are too.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SET ratelimit.test_clock_ms = '2900000000000';
SET ratelimit.subject_secret = 'stats-secret-7f3a';
-- The decision log prints versions: the counter moves forward (never back, so no version
-- is ever reused) to a value of its own, below the 99999 that privileges.sql uses.
SELECT setval('rl_policy_version_seq', 70000) AS version_counter;
INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, mode, fail_mode) VALUES
    ('st.api', 3, 3, '1 hour', 'enforce', 'closed'),
    ('st.shadow', 2, 2, '1 hour', 'shadow', 'closed'),
    ('st.off', 2, 2, '1 hour', 'disabled', 'closed'),
    ('st.open', 5, 5, '1 hour', 'enforce', 'open'),
    ('st.log', 2, 2, '1 hour', 'enforce', 'closed'),
    ('st.logshadow', 1, 1, '1 hour', 'shadow', 'closed'),
    ('st.quiet', 5, 5, '1 hour', 'enforce', 'closed'),
    ('st.calls', 5, 5, '1 hour', 'enforce', 'closed'),
    ('st.trigger', 3, 3, '1 hour', 'enforce', 'closed'),
    ('st.local', 3, 3, '1 hour', 'enforce', 'local');
INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES
    ('st.lease', 'concurrency', 1, '1 minute');
SELECT name, version FROM rl_policy WHERE name LIKE 'st.%' ORDER BY version;
INSERT INTO rl_override (policy, subject, action) VALUES
    ('st.api', 'st_vip', 'allow'),
    ('st.api', 'st_spammer', 'deny'),
    ('st.shadow', 'st_spammer', 'deny');

-- The view's columns.
SELECT attnum, attname, format_type(atttypid, atttypmod) AS type
FROM pg_attribute WHERE attrelid = 'rl_stats'::regclass AND attnum > 0 ORDER BY attnum;

-- The counters of one policy (the latency columns are printed as facts, not times).
CREATE FUNCTION pg_temp.counts(p text)
RETURNS TABLE (decisions bigint, allowed bigint, denied bigint, tokens_granted bigint,
               shadow_denials bigint, redis bigint, local bigint, fail_open bigint,
               fail_closed bigint, override bigint, disabled bigint, redis_calls bigint,
               redis_errors jsonb)
LANGUAGE sql AS $$
    SELECT decisions, allowed, denied, tokens_granted, shadow_denials, source_redis,
           source_local, source_fail_open, source_fail_closed, source_override,
           source_disabled, redis_calls, redis_errors
    FROM rl_stats WHERE policy = p
$$;
-- The round trips the histogram holds.
CREATE FUNCTION pg_temp.round_trips(histogram jsonb) RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce(sum((b ->> 'count')::bigint), 0) FROM jsonb_array_elements(histogram) b
$$;

-- A policy that has not decided since the server started has no row; its first decision
-- makes one.
SELECT count(*) AS rows_of_new_policies FROM rl_stats WHERE policy LIKE 'st.%';
SELECT allowed, remaining, source FROM rl_consume('st.quiet', 'st_first');
SELECT policy, decisions, allowed, tokens_granted, source_redis, redis_calls,
       latency_max_ms IS NOT NULL AS latency_known
FROM rl_stats WHERE policy LIKE 'st.%';

--
-- rl_stats_reset(): every row of this database zeroed (the rows stay), the time of the
-- reset kept.
--
CREATE TEMP TABLE before_reset AS SELECT clock_timestamp() AS at;
SELECT rl_stats_reset();
SELECT count(*) FILTER (WHERE decisions + allowed + denied + tokens_granted + shadow_denials
                              + source_redis + source_local + source_fail_open
                              + source_fail_closed + source_override + source_disabled
                              + redis_calls <> 0) AS nonzero_rows,
       count(*) FILTER (WHERE redis_errors <> '{}' OR latency_histogram <> '[]') AS nonempty_rows,
       count(*) FILTER (WHERE latency_p50_ms IS NOT NULL OR latency_p99_ms IS NOT NULL
                              OR latency_max_ms IS NOT NULL) AS rows_with_latency,
       bool_and(stats_reset BETWEEN (SELECT at FROM before_reset) AND clock_timestamp())
           AS reset_now
FROM rl_stats;
SELECT policy, decisions, redis_calls FROM rl_stats WHERE policy LIKE 'st.%';

--
-- Decisions that spend, and Redis calls.
--
-- st.api (3 tokens): 2 taken, then 2 more denied (1 left).
SELECT allowed, remaining, source FROM rl_consume('st.api', 'st_user', 2);
SELECT allowed, remaining, source FROM rl_consume('st.api', 'st_user', 2);
SELECT * FROM pg_temp.counts('st.api');
-- A peek asks Redis but decides nothing.
SELECT allowed, remaining, source FROM rl_peek('st.api', 'st_user');
SELECT decisions, redis_calls FROM rl_stats WHERE policy = 'st.api';
-- rl_enforce: the last token, then a denial, counted although it raises RL429.
SELECT allowed, remaining, source FROM rl_enforce('st.api', 'st_user');
SELECT expect_error($$SELECT * FROM rl_enforce('st.api', 'st_user')$$);
SELECT * FROM pg_temp.counts('st.api');
-- Overrides decide without Redis: counted as source override, no Redis call, no token.
SELECT allowed, remaining, source FROM rl_consume('st.api', 'st_vip', 3);
SELECT allowed, remaining, source FROM rl_consume('st.api', 'st_spammer');
-- rl_reserve spends too (committed: the tokens stay taken).
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('st.api', 'st_reserver', 2);
COMMIT;
SELECT * FROM pg_temp.counts('st.api');

-- Refunds and resets are Redis calls, not decisions; so is the refund of a reservation
-- rolled back (its take was a decision).
SELECT allowed, remaining, source FROM rl_consume('st.calls', 'st_user', 2);
SELECT allowed, remaining, source FROM rl_refund('st.calls', 'st_user', 1);
SELECT rl_reset('st.calls', 'st_user');
BEGIN;
SELECT allowed, remaining, source FROM rl_reserve('st.calls', 'st_user', 3);
ROLLBACK;
SELECT allowed, remaining, source FROM rl_peek('st.calls', 'st_user');
SELECT decisions, allowed, denied, source_redis, redis_calls FROM rl_stats WHERE policy = 'st.calls';

-- rl_consume_all: each check is a decision of its policy; the one Redis call counts for
-- the first policy.
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['st.api', 'st.open'], ARRAY['st_group/a', 'st_group/b'], ARRAY[1, 4]);
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['st.api', 'st.open'], ARRAY['st_group/a', 'st_group/b'], ARRAY[1, 4]);
SELECT 'st.api' AS policy, * FROM pg_temp.counts('st.api')
UNION ALL SELECT 'st.open', * FROM pg_temp.counts('st.open');

-- Shadow: a would-be denial is allowed, counted as a shadow denial and under the source
-- that would have denied (Redis, or a 'deny' override).
SELECT allowed, remaining, source FROM rl_consume('st.shadow', 'st_user', 2);
SELECT allowed, remaining, source FROM rl_consume('st.shadow', 'st_user');
SELECT allowed, remaining, source FROM rl_enforce('st.shadow', 'st_spammer');
SELECT * FROM pg_temp.counts('st.shadow');
-- Disabled: allowed, no Redis call, no token.
SELECT allowed, remaining, source FROM rl_consume('st.off', 'st_user', 2);
SELECT allowed, remaining, source FROM rl_enforce('st.off', 'st_user', 2);
SELECT * FROM pg_temp.counts('st.off');

-- rl_consume_all with a short shadow check asks Redis twice (once more without it):
-- both calls count, for the first policy (st.open: 3 calls in all).
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['st.open', 'st.shadow'], ARRAY['st_two', 'st_two'], ARRAY[1, 2]);
SELECT policy, allowed, remaining, source
FROM rl_consume_all(ARRAY['st.open', 'st.shadow'], ARRAY['st_two', 'st_two'], ARRAY[1, 2]);
SELECT 'st.open' AS policy, * FROM pg_temp.counts('st.open')
UNION ALL SELECT 'st.shadow', * FROM pg_temp.counts('st.shadow');

-- rl_acquire: a lease granted, one denied; the release at commit is a Redis call.
BEGIN;
SELECT allowed, remaining, source FROM rl_acquire('st.lease', 'st_user');
SELECT allowed, remaining, source FROM rl_acquire('st.lease', 'st_user');
COMMIT;
SELECT * FROM pg_temp.counts('st.lease');

-- rl_limit_trigger: one decision per row charged, a denial counted although it raises.
CREATE TABLE st_writes (tenant text, body text);
CREATE TRIGGER st_writes_limit BEFORE INSERT ON st_writes
    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('st.trigger', 'tenant');
INSERT INTO st_writes VALUES ('st_user', 'one'), ('st_user', 'two'), ('st_user', 'three');
SELECT expect_error($$INSERT INTO st_writes VALUES ('st_user', 'four')$$);
SELECT * FROM pg_temp.counts('st.trigger');
DROP TABLE st_writes;

-- Latency: known after round trips, p50 <= p99 <= max, inside the histogram's last bucket,
-- whose counts add up to the round trips (every call here was answered).
SELECT policy,
       latency_p50_ms > 0 AS p50_known,
       latency_p50_ms <= latency_p99_ms AND latency_p99_ms <= latency_max_ms AS ordered,
       latency_max_ms < (latency_histogram -> -1 ->> 'le_ms')::float8 AS max_in_last_bucket,
       pg_temp.round_trips(latency_histogram) = redis_calls AS histogram_sums_to_calls,
       (SELECT bool_and(b ->> 'le_ms' IS NOT NULL AND (b ->> 'count')::bigint > 0)
        FROM jsonb_array_elements(latency_histogram) b) AS buckets_well_formed,
       (SELECT array_agg((b ->> 'le_ms')::numeric ORDER BY n)
               = array_agg((b ->> 'le_ms')::numeric ORDER BY (b ->> 'le_ms')::numeric)
        FROM jsonb_array_elements(latency_histogram) WITH ORDINALITY AS h(b, n)) AS buckets_ascending
FROM rl_stats WHERE policy IN ('st.api', 'st.calls', 'st.open', 'st.shadow', 'st.lease', 'st.trigger')
ORDER BY policy;
-- Without a round trip there is no latency: an empty histogram, NULL latencies.
SELECT latency_p50_ms, latency_p99_ms, latency_max_ms, latency_histogram
FROM rl_stats WHERE policy = 'st.off';

--
-- The decision log: LOG lines, shown here by client_min_messages.
--
SET client_min_messages = log;
-- 'none' (the default): no line.
SELECT allowed FROM rl_consume('st.log', 'st_user');
-- 'denied': denials and shadow would-be denials, nothing else.
SET ratelimit.log_decisions = 'denied';
SELECT allowed FROM rl_consume('st.log', 'st_user');
SELECT allowed FROM rl_consume('st.log', 'st_user');
SELECT allowed, source FROM rl_consume('st.logshadow', 'st_user');
SELECT allowed, source FROM rl_consume('st.logshadow', 'st_user');
SELECT expect_error($$SELECT * FROM rl_enforce('st.log', 'st_user')$$);
SELECT allowed, source FROM rl_consume('st.api', 'st_spammer');
-- Not decisions that spend: no line.
SELECT allowed FROM rl_peek('st.log', 'st_user');
SELECT remaining FROM rl_refund('st.log', 'st_user', 1);
-- 'all': every decision that spends, with its cost; a subject that is no safe id is
-- hashed the same way.
SET ratelimit.log_decisions = 'all';
SELECT allowed FROM rl_consume('st.log', 'st_user');
SELECT allowed FROM rl_consume('st.log', 'alice@example.com', 2);
SELECT allowed FROM rl_peek('st.log', 'alice@example.com');
SELECT allowed FROM rl_consume('st.log', 'alice@example.com');
SELECT policy, allowed FROM rl_consume_all(ARRAY['st.log', 'st.quiet'], ARRAY['st_multi', 'st_multi']);
-- Sampled at 0: no line.
SET ratelimit.log_sample_rate = 0;
SELECT allowed FROM rl_consume('st.log', 'st_sampled');
SELECT allowed FROM rl_consume('st.log', 'st_sampled');
SELECT allowed FROM rl_consume('st.log', 'st_sampled');
RESET ratelimit.log_sample_rate;
-- 'none' again: no line.
SET ratelimit.log_decisions = 'none';
SELECT allowed FROM rl_consume('st.log', 'st_none');
SELECT allowed FROM rl_consume('st.log', 'st_none');
SELECT allowed FROM rl_consume('st.log', 'st_none');
RESET client_min_messages;
RESET ratelimit.log_decisions;
-- The hashes in the lines above are rl_subject_hash of the subjects.
SELECT rl_subject_hash('st_user') AS st_user, rl_subject_hash('st_spammer') AS st_spammer;
SELECT rl_subject_hash('alice@example.com') AS alice, rl_subject_hash('st_multi') AS st_multi;
-- That is the first 16 bytes, in hex, of the HMAC-SHA256 of the subject keyed by
-- ratelimit.subject_secret (RFC 2104, computed here without the extension).
CREATE FUNCTION pg_temp.hmac_sha256(key bytea, message bytea) RETURNS bytea
LANGUAGE sql AS $$
    WITH k AS (SELECT CASE WHEN length(key) > 64 THEN sha256(key) ELSE key END AS k),
         padded AS (SELECT k || decode(repeat('00', 64 - length(k)), 'hex') AS k FROM k),
         pads AS (SELECT decode(string_agg(lpad(to_hex(get_byte(k, i) # 54), 2, '0'), '' ORDER BY i), 'hex') AS ipad,
                         decode(string_agg(lpad(to_hex(get_byte(k, i) # 92), 2, '0'), '' ORDER BY i), 'hex') AS opad
                  FROM padded, generate_series(0, 63) AS i)
    SELECT sha256(opad || sha256(ipad || message)) FROM pads
$$;
SELECT s AS subject,
       rl_subject_hash(s) = left(encode(pg_temp.hmac_sha256(convert_to('stats-secret-7f3a', 'SQL_ASCII'),
                                                            convert_to(s, 'SQL_ASCII')), 'hex'), 32)
           AS is_hmac_sha256
FROM unnest(ARRAY['st_user', 'st_spammer', 'alice@example.com', 'tenant/user 7']) AS s;
SELECT rl_subject_hash('st_user') <> rl_subject_hash('st_user2') AS differs,
       rl_subject_hash(NULL) IS NULL AS strict;
-- Another secret, another hash.
SELECT rl_subject_hash('st_user') AS user_hash \gset
SET ratelimit.subject_secret = 'another-secret';
SELECT rl_subject_hash('st_user') <> :'user_hash' AS secret_matters;
SET ratelimit.subject_secret = 'stats-secret-7f3a';
-- An empty subject is bad input, as in a decision.
SELECT expect_error($$SELECT rl_subject_hash('')$$);

--
-- ratelimit.track_stats = off: decisions and Redis calls are not counted.
--
SELECT decisions, redis_calls FROM rl_stats WHERE policy = 'st.quiet';
SET ratelimit.track_stats = off;
SELECT allowed FROM rl_consume('st.quiet', 'st_untracked');
SELECT allowed FROM rl_peek('st.quiet', 'st_untracked');
RESET ratelimit.track_stats;
SELECT decisions, redis_calls FROM rl_stats WHERE policy = 'st.quiet';
SELECT allowed FROM rl_consume('st.quiet', 'st_untracked');
SELECT decisions, redis_calls FROM rl_stats WHERE policy = 'st.quiet';

--
-- Redis that cannot answer: decisions by the fail mode, the failures by class; the calls
-- the breaker skips are not Redis calls.
--
SELECT rl_stats_reset();
SET ratelimit.retry_interval = '1h';
SET ratelimit.redis_url = 'redis://127.0.0.1:1';
SELECT allowed, source FROM rl_consume('st.open', 'st_down');
SELECT allowed, source FROM rl_consume('st.open', 'st_down');
SELECT allowed, source FROM rl_consume('st.api', 'st_down');
-- A local bucket decides, and takes tokens.
SELECT allowed, remaining, source FROM rl_consume('st.local', 'st_down', 2);
SELECT allowed, remaining, source FROM rl_consume('st.local', 'st_down', 2);
-- No URL at all: a configuration failure.
SET ratelimit.redis_url = '';
SELECT allowed, source FROM rl_consume('st.api', 'st_down');
SELECT allowed, source FROM rl_consume('st.api', 'st_down');
SELECT expect_error($$SELECT * FROM rl_enforce('st.api', 'st_down')$$);
RESET ratelimit.redis_url;
RESET ratelimit.retry_interval;
SELECT 'st.api' AS policy, * FROM pg_temp.counts('st.api')
UNION ALL SELECT 'st.open', * FROM pg_temp.counts('st.open')
UNION ALL SELECT 'st.local', * FROM pg_temp.counts('st.local');
-- Failed calls have no round trip.
SELECT policy, latency_max_ms, latency_histogram FROM rl_stats
WHERE policy IN ('st.api', 'st.open', 'st.local') ORDER BY policy;
-- Redis answers again.
SELECT allowed, source FROM rl_consume('st.open', 'st_down');
SELECT redis_calls, pg_temp.round_trips(latency_histogram) AS round_trips,
       latency_max_ms IS NOT NULL AS latency_known
FROM rl_stats WHERE policy = 'st.open';

--
-- rl_stats_reset() zeroes the rows; they stay.
--
SELECT rl_stats_reset();
SELECT policy, decisions, allowed, denied, tokens_granted, shadow_denials, redis_calls,
       source_redis + source_local + source_fail_open + source_fail_closed + source_override
       + source_disabled AS by_source, redis_errors, latency_p50_ms, latency_p99_ms,
       latency_max_ms, latency_histogram
FROM rl_stats WHERE policy LIKE 'st.%' ORDER BY policy;

--
-- Privileges: a plain role may neither read rl_stats, nor reset it, nor hash subjects, nor
-- set the superuser-only settings; a member of pg_monitor may read rl_stats.
--
CREATE ROLE regress_stats_plain;
CREATE ROLE regress_stats_monitor IN ROLE pg_monitor;
SET ROLE regress_stats_plain;
SELECT expect_error($$SELECT * FROM rl_stats$$);
SELECT expect_error($$SELECT * FROM _rl_stats_read()$$);
SELECT expect_error($$SELECT rl_stats_reset()$$);
SELECT expect_error($$SELECT rl_subject_hash('st_user')$$);
SELECT expect_error($$SET ratelimit.log_decisions = 'all'$$);
SELECT expect_error($$SET ratelimit.log_sample_rate = 0.5$$);
SELECT expect_error($$SET ratelimit.track_stats = off$$);
SHOW ratelimit.log_decisions;
RESET ROLE;
SELECT allowed FROM rl_consume('st.quiet', 'st_last');
SET ROLE regress_stats_monitor;
SELECT policy, decisions, allowed, redis_calls FROM rl_stats WHERE policy LIKE 'st.%' AND decisions > 0;
SELECT policy, decisions FROM _rl_stats_read() WHERE policy = 'st.quiet';
SELECT expect_error($$SELECT rl_stats_reset()$$);
SELECT expect_error($$SELECT rl_subject_hash('st_user')$$);
SELECT expect_error($$SET ratelimit.track_stats = off$$);
RESET ROLE;
DROP ROLE regress_stats_plain, regress_stats_monitor;

DELETE FROM rl_policy WHERE name LIKE 'st.%';
RESET ratelimit.subject_secret;
RESET ratelimit.test_clock_ms;
