-- token_bucket/common.lua: what take, peek and refund share (after lib.lua).
--
-- Refill pro rata since the last write, on Redis's clock. Levels are integers in
-- "units": one token is `unit` units and one millisecond adds `rate` units, so refill
-- needs no fractions. The caller (algorithm/token_bucket.c) reduces refill_amount /
-- refill_period by their gcd and guarantees capacity + rate < 2^53, so every value
-- here is an exactly represented Lua number.
--
-- A bucket is a string "<level> <time>" (units, ms since the epoch) written with its
-- TTL in one command, SET ... PX (a hash of `level` and `time`, as ratelimit 0.3 wrote,
-- is read too). A missing key is a full bucket: the TTL, at least the time to refill
-- completely, never expires one that is not yet full.
--
-- Each bucket takes 5 arguments: capacity in units, rate (units per ms), unit (units per
-- token), cost in tokens, TTL in ms. Replies are {allowed (0|1), remaining tokens,
-- retry_after_ms, reset_after_ms} per bucket.

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

-- The clock the buckets see, checked: a whole number of ms.
local function bucket_clock(arg)
  local now = now_ms(arg)
  if not is_exact(now) then
    error({err = 'ERR ratelimit clock is not a whole number of ms'})
  end
  return now
end

-- Whether a bucket is stored, and its level and time (nil when unreadable).
local function read_state(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' and value.err then
    if string.find(value.err, 'WRONGTYPE', 1, true) ~= 1 then
      raise(value, 'GET')
    end
    -- Written by ratelimit 0.3: a hash (any other type is still WRONGTYPE here).
    local fields = call('HMGET', key, 'level', 'time')
    return true, tonumber(fields[1]), tonumber(fields[2])
  end
  if not value then
    return false
  end
  local level, last = string.match(value, '^(%d+) (%d+)$')
  return true, tonumber(level), tonumber(last)
end

-- The bucket at key with its 5 arguments from ARGV[first], refilled to now.
local function load_bucket(key, first, now)
  local b = {
    key = key,
    capacity = tonumber(ARGV[first]),
    rate = tonumber(ARGV[first + 1]),
    unit = tonumber(ARGV[first + 2]),
    ttl = tonumber(ARGV[first + 4]),
  }
  b.cost = tonumber(ARGV[first + 3]) * b.unit
  local stored, level, last = read_state(key)
  if not stored then
    b.level = b.capacity
    b.last = now
  else
    b.level = level
    b.last = last
    if not is_exact(b.level) or not is_exact(b.last) then
      error({err = 'ERR ratelimit bucket state is corrupt'})
    end
    if b.level > b.capacity then
      b.level = b.capacity
    end
  end
  -- Refill. A clock that steps backwards adds nothing and does not move `last`
  -- back, so the same interval is never counted twice.
  if now > b.last then
    local elapsed = now - b.last
    if elapsed >= ceil_div(b.capacity - b.level, b.rate) then
      b.level = b.capacity
    else
      b.level = b.level + elapsed * b.rate
    end
    b.last = now
  end
  -- After a backwards step, refill resumes only once the clock is past `last`
  -- again (and the key must live that much longer).
  b.paused = 0
  if b.last > now then
    b.paused = b.last - now
  end
  return b
end

-- The buckets KEYS[1..#KEYS], their arguments after ARGV[1] (the clock). A bucket
-- named twice shares one state (`same`), so its costs add up.
local function load_buckets(now)
  local buckets = {}
  local shared = {}
  for i = 1, #KEYS do
    local b = load_bucket(KEYS[i], 2 + 5 * (i - 1), now)
    if shared[b.key] then
      b.level = nil
      b.same = shared[b.key]
    else
      shared[b.key] = b
    end
    buckets[i] = b
  end
  return buckets
end

local function state_of(b)
  return b.same or b
end

-- Decides every bucket, charging earlier ones first; true when all hold their cost.
-- A denial takes nothing: its wait counts from what is left after the checks before it.
local function decide(buckets)
  local all = true
  for i = 1, #buckets do
    local b = buckets[i]
    local s = state_of(b)
    if s.level >= b.cost then
      b.granted = true
      s.level = s.level - b.cost
    else
      b.granted = false
      b.retry = add(s.paused, ceil_div(b.cost - s.level, b.rate))
      all = false
    end
  end
  return all
end

-- Gives back what decide charged: nothing is taken.
local function put_back(buckets)
  for i = 1, #buckets do
    local b = buckets[i]
    if b.granted then
      local s = state_of(b)
      s.level = s.level + b.cost
    end
  end
end

-- Writes a bucket's state and its TTL in one command.
local function write_state(b)
  call('SET', b.key, string.format('%d %d', b.level, b.last), 'PX', add(b.ttl, b.paused))
end

-- The reply of buckets: allowed says which were granted.
local function reply_of(buckets, allowed)
  local reply = {}
  for i = 1, #buckets do
    local b = buckets[i]
    local s = state_of(b)
    local retry_after = 0
    local reset_after = 0
    if allowed[i] == 0 and b.granted == false then
      retry_after = b.retry
    end
    if s.level < s.capacity then
      reset_after = add(s.paused, ceil_div(s.capacity - s.level, s.rate))
    end
    reply[4 * i - 3] = allowed[i]
    reply[4 * i - 2] = floor_div(s.level, s.unit)
    reply[4 * i - 1] = retry_after
    reply[4 * i] = reset_after
  end
  return reply
end

