-- bench/script_cost/minimal.lua: the least a token bucket in take_one's state does: the
-- clock, the arguments, the state read (string.match) and written (string.format), refill
-- and take; none of take_one's checks (corrupt state, 0.3's hashes, a clock stepping back,
-- exact arithmetic near 2^53) and no retry-after or reset.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local capacity = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5]) * unit
local ttl = tonumber(ARGV[6])
local level, last = capacity, now
local value = redis.call('GET', KEYS[1])
if value then
  local l, s = string.match(value, '^(%d+) (%d+)$')
  level, last = tonumber(l), tonumber(s)
  if now > last then
    if (now - last) * rate >= capacity - level then level = capacity else level = level + (now - last) * rate end
    last = now
  end
end
local allowed = 0
if level >= cost then
  allowed = 1
  level = level - cost
  redis.call('SET', KEYS[1], string.format('%d %d', level, last), 'PX', ttl)
end
return {allowed, math.floor(level / unit), 0, 0}
