-- bench/script_cost/args.lua: the floor (bench/commands_only.lua: TIME, GET, SET ... PX) plus
-- reading the clock and the five numbers of take_one's arguments, as take_one reads them.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5]) * unit
local ttl = tonumber(ARGV[6])
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '59999999999 1800000000000', 'PX', ARGV[6])
return {1, 0, 0, 0}
