-- ratelimit 0.12.0 -> 0.13.0: one pipelined connection per server and Redis node
-- (ratelimit.redis_connections = shared, a setting of the library: nothing in SQL changes).
\echo Use "ALTER EXTENSION ratelimit UPDATE TO '0.13.0'" to load this file. \quit
