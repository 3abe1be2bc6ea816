-- gcra/take_one.lua: rl_consume's take of one GCRA key, gcra/common.lua inlined (composed
-- after lib.lua only): one GET, one SET when granted, since one Redis core serves every
-- server that shares the budget. The same arguments, answers and state as the group
-- script's GCRA checks (test/t/012 runs both).
-- KEYS[1]  the arrival time
-- ARGV     "now" in ms for tests (empty: Redis TIME), tolerance (capacity units), rate
--          (units per ms), unit (units per token), cost in tokens, TTL in ms (0: the TAT)
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
if #ARGV ~= 6 then
  return expect_args(6)
end
local key = KEYS[1]
local tolerance = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5]) * unit
local now = now_ms(ARGV[1])
if not is_exact(now) then
  error({err = 'ERR ratelimit clock is not a whole number of ms'})
end
if now * rate > EXACT_MAX - tolerance - cost then
  error({err = 'ERR ratelimit clock is beyond what gcra holds exactly'})
end
now = now * rate
local tat = now
local value = redis.pcall('GET', key)
if value then
  if type(value) == 'table' then
    raise(value, 'GET')
  end
  local stored = tonumber(value)
  if not is_exact(stored) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  if stored > now then
    tat = stored
  end
end
local allowed, retry = 0, 0
if tat + cost - now <= tolerance then
  allowed = 1
  tat = tat + cost
  local px = ceil_div(tat - now, rate)
  local ttl = tonumber(ARGV[6])
  if ttl > px then
    px = ttl
  end
  call('SET', key, string.format('%d', tat), 'PX', px)
else
  retry = ceil_div(tat + cost - tolerance - now, rate)
end
local remaining = 0
if tat - now < tolerance then
  remaining = floor_div(tolerance - (tat - now), unit)
end
return {allowed, remaining, retry, ceil_div(tat - now, rate)}
