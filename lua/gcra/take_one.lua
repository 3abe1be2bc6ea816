-- gcra/take_one.lua: rl_consume's take of one GCRA key, gcra/common.lua inlined (composed
-- after lib.lua only): one GET, one SET when granted, and as few Lua steps as exactness
-- allows, since one Redis core serves every server that shares the budget. The same
-- arguments, answers and state as the group script's GCRA checks (test/t/012 runs both).
-- KEYS[1]  the arrival time
-- ARGV     "now" in ms for tests (empty: Redis TIME), tolerance (capacity units), rate
--          (units per ms), unit (units per token), cost in tokens, TTL in ms (0: the TAT)
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
if #ARGV ~= 6 then
  return expect_args(6)
end
local floor = math.floor
local key = KEYS[1]
local tolerance = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5]) * unit
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
-- A whole number of ms, and now * rate + tolerance exact (below 2^53): a granted TAT is at
-- most that, and sums with a cost are made from TAT - now (see common.lua).
if not (now and now >= 0 and now == floor(now)) then
  error({err = 'ERR ratelimit clock is not a whole number of ms'})
end
now = now * rate
if now > EXACT_MAX - tolerance then
  error({err = 'ERR ratelimit clock is beyond what gcra holds exactly'})
end
local tat = now
local value = redis.pcall('GET', key)
if value then
  if type(value) == 'table' then
    raise(value, 'GET')
  end
  local stored = tonumber(value)
  if not (stored and stored >= 0 and stored <= EXACT_MAX and stored == floor(stored)) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  if stored > now then
    tat = stored
  end
end
local allowed, retry = 0, 0
if tat - now + cost <= tolerance then
  allowed = 1
  tat = tat + cost
end
local ahead = tat - now
local reset = ceil_div(ahead, rate)
if allowed == 1 then
  local px = tonumber(ARGV[6])
  if reset > px then
    px = reset
  end
  call('SET', key, string.format('%d', tat), 'PX', px)
else
  retry = ceil_div(ahead + cost - tolerance, rate)
end
local remaining = 0
if ahead < tolerance then
  remaining = floor_div(tolerance - ahead, unit)
end
return {allowed, remaining, retry, reset}
