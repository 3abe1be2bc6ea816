-- Token bucket: refill pro rata since the last write, then take `cost` tokens if they
-- are all there (or, by mode, only look, or give tokens back). Runs atomically in
-- Redis, on Redis's clock. Several buckets in one call (rl_consume_all) are taken all
-- or none.
--
-- Levels are integers in "units": one token is `unit` units and one millisecond adds
-- `rate` units, so refill needs no fractions. The caller (bucket.c) reduces
-- refill_amount/refill_period by their gcd and guarantees capacity + rate < 2^53, so
-- every value below is an exactly represented Lua number.
--
-- A script that fails halfway keeps what it wrote (Redis has no rollback), so every
-- check comes before the first write, and each bucket is written by one command that
-- also sets its TTL: SET with PX. Under OOM the first write is refused with nothing
-- written; a command the ACL refuses is found before anything is written.
--
-- KEYS[1]  the bucket: a string "<level> <time>" (units, ms since the epoch) with a TTL
--          (a hash of `level` and `time`, as ratelimit 0.3 wrote, is read too)
-- ARGV[1]  capacity in units        ARGV[2]  rate: units added per millisecond
-- ARGV[3]  unit: units per token    ARGV[4]  cost in tokens (0 .. capacity)
-- ARGV[5]  TTL in ms, at least the time to refill completely
-- ARGV[6]  optional "now" in ms since the epoch, for tests; empty means Redis TIME
-- ARGV[7]  optional mode: "take" (the default), "peek" (decide, write nothing) or
--          "refund" (give ARGV[4] tokens back, never above capacity)
-- KEYS[2]  refund only, optional: a key that marks this refund as done, so that a
--          retried refund credits nothing (it lives a minute at most)
-- Several buckets ("take" or "peek"): KEYS[i] with ARGV[7i-6 .. 7i-2] as above; now
-- and mode come from ARGV[6] and ARGV[7]. A bucket named twice is charged twice.
-- Returns {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms} per
-- bucket; a refund answers allowed 0 when KEYS[2] showed it was already done. A
-- command the ACL refuses is answered with the error "NOPERM <COMMAND>".

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

-- Raises a Redis error reply; one that says the ACL refused names the command.
local function raise(reply, command)
  local err = reply.err
  if string.find(err, 'NOPERM', 1, true) == 1 or string.find(err, "can't run", 1, true)
     or string.find(err, "can't access", 1, true) then
    error({err = 'NOPERM ' .. command})
  end
  error(reply)
end

-- Runs a Redis command, raising its error (see raise).
local function call(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    raise(reply, command)
  end
  return reply
end

-- Before the first write: raises NOPERM when the ACL would refuse this write
-- (Redis 7 and later can tell in advance).
local function may_write(command, ...)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, ...) then
    error({err = 'NOPERM ' .. command})
  end
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

-- Writes a bucket's state and its TTL in one command.
local function write_state(b, level, ttl)
  call('SET', b.key, string.format('%d %d', level, b.last), 'PX', ttl)
end

local mode = ARGV[7] or 'take'
local now
if ARGV[6] ~= nil and ARGV[6] ~= '' then
  now = tonumber(ARGV[6])
else
  local t = call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if not is_exact(now) then
  return redis.error_reply('ERR ratelimit clock is not a whole number of ms')
end

-- Each bucket: its parameters, and its state refilled to now.
local buckets = {}
-- One bucket takes 5 to 7 arguments; several take 7 each.
local count = math.max(1, math.floor(#ARGV / 7))
if mode == 'refund' then
  count = 1
end
for i = 1, count do
  local base = 7 * (i - 1)
  local b = {
    key = KEYS[i],
    capacity = tonumber(ARGV[base + 1]),
    rate = tonumber(ARGV[base + 2]),
    unit = tonumber(ARGV[base + 3]),
    ttl = tonumber(ARGV[base + 5]),
  }
  b.cost = tonumber(ARGV[base + 4]) * b.unit
  local stored, level, last = read_state(b.key)
  if not stored then
    -- A missing key is a full bucket: the TTL never expires one that is not yet full.
    b.level = b.capacity
    b.last = now
  else
    b.level = level
    b.last = last
    if not is_exact(b.level) or not is_exact(b.last) then
      return redis.error_reply('ERR ratelimit bucket state is corrupt')
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
  buckets[i] = b
end

-- A bucket named twice shares one state, so its costs add up.
local shared = {}
for i = 1, count do
  local b = buckets[i]
  if shared[b.key] then
    b.level = nil
    b.same = shared[b.key]
  else
    shared[b.key] = b
  end
end
local function state_of(b)
  return b.same or b
end

-- Decide: every bucket must hold its cost (charging earlier ones first).
local all = true
local decided = {}
for i = 1, count do
  local b = buckets[i]
  local s = state_of(b)
  if mode == 'refund' then
    decided[i] = 1
  elseif s.level >= b.cost then
    decided[i] = 1
    s.level = s.level - b.cost
  else
    -- A denial takes nothing and writes nothing: the stored state refills the same.
    -- Its wait counts from what is left here, after the checks before it.
    decided[i] = 0
    b.retry = add(s.paused, ceil_div(b.cost - s.level, b.rate))
    all = false
  end
end

-- Write: a refund (once per mark), or every take when all were granted.
if mode == 'refund' then
  local b = buckets[1]
  local ttl = add(b.ttl, b.paused)
  -- The mark only has to outlive a retry of this refund: a minute at most.
  local mark_ttl = math.min(ttl, 60000)
  if KEYS[2] ~= nil then
    may_write('SET', KEYS[2], '1', 'NX', 'PX', mark_ttl)
    may_write('SET', b.key, '0 0', 'PX', ttl)
  end
  if KEYS[2] == nil or call('SET', KEYS[2], '1', 'NX', 'PX', mark_ttl) then
    b.level = math.min(b.capacity, b.level + b.cost)
    write_state(b, b.level, ttl)
  else
    decided[1] = 0
  end
elseif not all or mode == 'peek' then
  -- Nothing is taken: put back what the decision above charged.
  for i = 1, count do
    local b = buckets[i]
    if decided[i] == 1 then
      local s = state_of(b)
      s.level = s.level + b.cost
    end
  end
else
  if count > 1 then
    for i = 1, count do
      may_write('SET', buckets[i].key, '0 0', 'PX', 1)
    end
  end
  for i = 1, count do
    local b = buckets[i]
    if not b.same then
      write_state(b, b.level, add(b.ttl, b.paused))
    end
  end
end

local reply = {}
for i = 1, count do
  local b = buckets[i]
  local s = state_of(b)
  local allowed = 0
  local retry_after = 0
  if mode == 'refund' then
    allowed = decided[1]
  elseif all or (mode == 'peek' and decided[i] == 1) then
    allowed = 1
  elseif decided[i] == 0 then
    retry_after = b.retry
  end
  local reset_after = 0
  if s.level < s.capacity then
    reset_after = add(s.paused, ceil_div(s.capacity - s.level, s.rate))
  end
  reply[4 * i - 3] = allowed
  reply[4 * i - 2] = floor_div(s.level, s.unit)
  reply[4 * i - 1] = retry_after
  reply[4 * i] = reset_after
end
return reply
