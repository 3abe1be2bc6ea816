-- bench/script_cost/format.lua: the floor plus writing the state as take_one writes it
-- (string.format of level and time).
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], string.format('%d %d', 59999999999, 1800000000000), 'PX', ARGV[6])
return {1, 0, 0, 0}
