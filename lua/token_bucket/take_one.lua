-- token_bucket/take_one.lua: take.lua for one bucket (rl_consume), with nothing of
-- the N-bucket machinery: the same arguments, answers and state as take.lua with one
-- key (test/t/010 runs its whole model against both), in as few Lua steps as they
-- allow, since one Redis core serves every server that shares the budget. Composed
-- after lib.lua only (dev/lua-script: a *_one.lua script inlines its algorithm).
-- KEYS[1]  the bucket
-- ARGV     "now" in ms for tests (empty: Redis TIME), capacity units, rate (units per
--          ms), unit (units per token), cost in tokens, TTL in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
if #ARGV ~= 6 then
  return expect_args(6)
end
local floor = math.floor
local EXACT_MAX = 9007199254740991

-- ceil(a / b) of whole numbers, exactly (a / b can be off by one near an integer).
local function ceil_div(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  if q * b < a then
    q = q + 1
  end
  return q
end
local key = KEYS[1]
local capacity = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local unit = tonumber(ARGV[4])
local cost = tonumber(ARGV[5]) * unit
local ttl = tonumber(ARGV[6])
local now = now_ms(ARGV[1])
if now == nil or now < 0 or now > EXACT_MAX or now ~= floor(now) then
  error({err = 'ERR ratelimit clock is not a whole number of ms'})
end

local level, last = capacity, now
local value = redis.pcall('GET', key)
if value then
  if type(value) == 'table' then
    if string.find(value.err, 'WRONGTYPE', 1, true) ~= 1 then
      raise(value, 'GET')
    end
    -- Written by ratelimit 0.3: a hash.
    local fields = call('HMGET', key, 'level', 'time')
    level, last = tonumber(fields[1]), tonumber(fields[2])
  else
    local l, t = string.match(value, '^(%d+) (%d+)$')
    level, last = tonumber(l), tonumber(t)
  end
  -- Whole numbers in [0, 2^53) only (not nil, nan, -1, 1.5, 1e20 ...).
  if not (level and last and level >= 0 and level <= EXACT_MAX and level == floor(level)
          and last >= 0 and last <= EXACT_MAX and last == floor(last)) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  if level > capacity then
    level = capacity
  end
  -- Refill. A clock that steps back adds nothing, and refill resumes past `last`.
  -- (elapsed * rate rounds, if at all, only above 2^53 > capacity: the test is exact.)
  if now > last then
    if (now - last) * rate >= capacity - level then
      level = capacity
    else
      level = level + (now - last) * rate
    end
    last = now
  end
end
local paused = 0
if last > now then
  paused = last - now
end

local allowed, retry, reset = 0, 0, 0
if level >= cost then
  allowed = 1
  level = level - cost
  local px = ttl + paused
  if px > EXACT_MAX then
    px = EXACT_MAX
  end
  call('SET', key, string.format('%d %d', level, last), 'PX', px)
else
  retry = paused + ceil_div(cost - level, rate)
  if retry > EXACT_MAX then
    retry = EXACT_MAX
  end
end
if level < capacity then
  reset = paused + ceil_div(capacity - level, rate)
  if reset > EXACT_MAX then
    reset = EXACT_MAX
  end
end
-- Whole tokens left: floor(level / unit), exactly.
local remaining = floor(level / unit)
if remaining * unit > level then
  remaining = remaining - 1
elseif (remaining + 1) * unit <= level then
  remaining = remaining + 1
end
return {allowed, remaining, retry, reset}
