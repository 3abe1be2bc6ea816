-- Settings: checked when set, with a clear message that never echoes a password.

-- Fixtures: the extension and expect_error (sql/include/fixtures.sql), quietly.
\set ECHO none
\ir sql/include/fixtures.sql

SELECT name, CASE WHEN name = 'ratelimit.redis_url' THEN '(set by the test)' ELSE setting END AS setting,
       unit, context
FROM pg_settings WHERE name LIKE 'ratelimit.%' ORDER BY name;

-- redis_url: the accepted forms.
SET ratelimit.redis_url = 'redis://127.0.0.1';
SET ratelimit.redis_url = 'redis://127.0.0.1:6380/2';
SET ratelimit.redis_url = 'redis://:s3cret@127.0.0.1:6380';
SET ratelimit.redis_url = 'redis://app:p%40ss@127.0.0.1:6380/0';
SET ratelimit.redis_url = 'redis://[::1]:6380';
SET ratelimit.redis_url = 'redis://redis.internal:6379/';
SET ratelimit.redis_url = 'unix:///run/redis/redis.sock';
SET ratelimit.redis_url = 'unix:///run/redis/redis.sock?db=3';
SET ratelimit.redis_url = 'unix://app:secret@/run/redis/redis.sock?db=3';
-- TLS, and Sentinel: the sentinels (26379 when no port is given), then the master's name.
SET ratelimit.redis_url = 'rediss://app:s3cret@redis.example.com:6380/1';
SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1:26379,10.0.0.2,[::1]:26380/mymaster';
SET ratelimit.redis_url = 'redis-sentinel://app:s3cret@sentinel.internal/my.master-1?db=2&sentinel_user=watcher';
SET ratelimit.redis_url = 'rediss-sentinel://10.0.0.1:26379/mymaster?sentinel_user=watcher&db=0';
-- Cluster seeds (0.6.0): several nodes, TLS too, database 0 only.
SET ratelimit.redis_url = 'redis://10.0.0.1:6379,10.0.0.2:6380,[::1]';
SET ratelimit.redis_url = 'rediss://app:s3cret@node-a.internal,node-b.internal:6380/0';
SET ratelimit.redis_url = '';
-- ... and the rejected ones, with a message that says why and never shows the password.
SET ratelimit.redis_url = 'redis://app:s3cret@127.0.0.1:99999';
SET ratelimit.redis_url = 'postgres://app:s3cret@127.0.0.1';
SELECT expect_error($$SET ratelimit.redis_url = 'http://127.0.0.1'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:0'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:65536'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:port'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:6379/db'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://127.0.0.1:6379/1/2'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://[::1'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://user:p%zzss@127.0.0.1'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://host name'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'unix://relative/path.sock'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'unix:///run/redis.sock?database=1'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'rediss://'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1:26379'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://10.0.0.1,10.0.0.2/1'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://10.0.0.1,,10.0.0.2'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis://10.0.0.1,10.0.0.2:0'$$);
-- At most 16 cluster nodes.
SELECT expect_error('SET ratelimit.redis_url = ' || quote_literal('redis://' || repeat('h,', 16) || 'h'));
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1:26379/'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1,/mymaster'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1/my master'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1/mymaster?db=x'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1/mymaster?password=x'$$);
SELECT expect_error($$SET ratelimit.redis_url = 'redis-sentinel://10.0.0.1/mymaster?sentinel_user=a%20b'$$);
-- At most 16 sentinels.
SELECT expect_error('SET ratelimit.redis_url = '
                    || quote_literal('redis-sentinel://' || repeat('10.0.0.1,', 16) || '10.0.0.1/mymaster'));

-- Timeouts are unit-aware milliseconds.
SET ratelimit.command_timeout = '2s';
SHOW ratelimit.command_timeout;
SET ratelimit.connect_timeout = 1500;
SHOW ratelimit.connect_timeout;
SELECT expect_error($$SET ratelimit.command_timeout = 0$$);
SELECT expect_error($$SET ratelimit.command_timeout = '2 parsecs'$$);

-- Key segments are safe ids: no separator, no brace, no empty prefix.
SELECT expect_error($$SET ratelimit.key_prefix = ''$$);
SELECT expect_error($$SET ratelimit.key_prefix = 'a:b'$$);
SELECT expect_error($$SET ratelimit.key_scope = '{x}'$$);
SET ratelimit.key_prefix = 'ratelimit-prod';
SET ratelimit.key_scope = 'eu-1';

-- The test clock takes ms since the epoch, nothing else.
SELECT expect_error($$SET ratelimit.test_clock_ms = '-1'$$);
SELECT expect_error($$SET ratelimit.test_clock_ms = 'now'$$);

-- The prefix is reserved: a typo is caught.
SELECT expect_error($$SET ratelimit.command_timout = 5$$);
