-- Token bucket: refill pro rata since the last write, then take `cost` tokens if they
-- are all there (or, by mode, only look, or give tokens back). Runs atomically in
-- Redis, on Redis's clock.
--
-- Levels are integers in "units": one token is `unit` units and one millisecond adds
-- `rate` units, so refill needs no fractions. The caller (bucket.c) reduces
-- refill_amount/refill_period by their gcd and guarantees capacity + rate < 2^53, so
-- every value below is an exactly represented Lua number.
--
-- KEYS[1]  the bucket: a hash with fields `level` (units) and `time` (ms)
-- ARGV[1]  capacity in units        ARGV[2]  rate: units added per millisecond
-- ARGV[3]  unit: units per token    ARGV[4]  cost in tokens (1 .. capacity)
-- ARGV[5]  TTL in ms, at least the time to refill completely
-- ARGV[6]  optional "now" in ms since the epoch, for tests; empty means Redis TIME
-- ARGV[7]  optional mode: "take" (the default), "peek" (decide, write nothing) or
--          "refund" (give ARGV[4] tokens back, never above capacity)
-- KEYS[2]  refund only, optional: a key that marks this refund as done, so that a
--          retried refund credits nothing (it lives as long as the bucket)
-- Returns {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}; a refund
-- answers allowed 0 when KEYS[2] showed it was already done.

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local unit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4]) * unit
local ttl = tonumber(ARGV[5])
local mode = ARGV[7] or 'take'

-- Largest integer a double holds exactly; sums that could pass it saturate there.
local EXACT_MAX = 9007199254740991

-- True for a whole number in [0, EXACT_MAX] (false for nan, inf, 1.5, 1e20 ...).
local function is_exact(x)
  return x ~= nil and x >= 0 and x <= EXACT_MAX and x == math.floor(x)
end

-- a + b, saturating at EXACT_MAX (only absurd pauses of centuries reach it).
local function add(a, b)
  local sum = a + b
  if sum > EXACT_MAX then
    return EXACT_MAX
  end
  return sum
end

local now
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  now = tonumber(ARGV[6])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if not is_exact(now) then
  return redis.error_reply('ERR ratelimit clock is not a whole number of ms')
end

-- Division of doubles can be off by one near an integer: correct it exactly.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then
    q = q + 1
  end
  return q
end

local state = redis.call('HMGET', key, 'level', 'time')
local level, last
if not state[1] and not state[2] then
  -- A missing key is a full bucket: the TTL never expires one that is not yet full.
  level = capacity
  last = now
else
  level = tonumber(state[1])
  last = tonumber(state[2])
  if not is_exact(level) or not is_exact(last) then
    return redis.error_reply('ERR ratelimit bucket state is corrupt')
  end
  if level > capacity then
    level = capacity
  end
end

-- Refill. A clock that steps backwards adds nothing and does not move `last` back,
-- so the same interval is never counted twice.
if now > last then
  local elapsed = now - last
  if elapsed >= ceil_div(capacity - level, rate) then
    level = capacity
  else
    level = level + elapsed * rate
  end
  last = now
end

-- After a backwards step, refill resumes only once the clock is past `last` again
-- (and the key must live that much longer).
local paused = 0
if last > now then
  paused = last - now
end

local allowed = 0
local retry_after = 0
if mode == 'refund' then
  if KEYS[2] == nil or redis.call('SET', KEYS[2], '1', 'NX', 'PX', add(ttl, paused)) then
    level = math.min(capacity, level + cost)
    allowed = 1
    redis.call('HSET', key, 'level', level, 'time', last)
    redis.call('PEXPIRE', key, add(ttl, paused))
  end
elseif level >= cost then
  allowed = 1
  if mode ~= 'peek' then
    level = level - cost
    redis.call('HSET', key, 'level', level, 'time', last)
    redis.call('PEXPIRE', key, add(ttl, paused))
  end
else
  -- A denial takes nothing and writes nothing: the stored state still refills the same.
  retry_after = add(paused, ceil_div(cost - level, rate))
end

local reset_after = 0
if level < capacity then
  reset_after = add(paused, ceil_div(capacity - level, rate))
end

return {allowed, floor_div(level, unit), retry_after, reset_after}
