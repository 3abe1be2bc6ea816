-- bench/commands_only.lua: the three Redis commands a token bucket decision needs and
-- nothing else (TIME, GET of the state, SET of a new one with its TTL), for bench/run
-- phase 1b to show the floor under any script that keeps its state this way.
-- KEYS[1] the bucket; ARGV as take_one's (unused but for the TTL).
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '59999999999 1800000000000', 'PX', ARGV[6])
return {1, 0, 0, 0}
