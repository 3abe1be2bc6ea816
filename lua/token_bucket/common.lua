-- token_bucket/common.lua: the token bucket as peek, refund and the group script use it
-- (after lib.lua; take_one.lua, rl_consume's take, inlines it).
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

-- Writes a bucket's state and its TTL in one command.
local function write_state(b)
  call('SET', b.key, string.format('%d %d', b.level, b.last), 'PX', add(b.ttl, b.paused))
end

-- The token bucket as a cell of group.lua (the same interface in every algorithm's
-- common.lua): load a check's state, try its cost, undo a try, give back, write, answer.
local TOKEN_BUCKET = {nkeys = 1, nargs = 5, clock = true}

function TOKEN_BUCKET.load(k, a, now)
  return load_bucket(KEYS[k], a, now)
end

function TOKEN_BUCKET.try(s, e)
  if s.level >= e.cost then
    s.level = s.level - e.cost
    return true
  end
  e.retry = add(s.paused, ceil_div(e.cost - s.level, s.rate))
  return false
end

function TOKEN_BUCKET.undo(s, e)
  s.level = s.level + e.cost
end

-- A bucket written ahead of now (last > now: waits booked, a cost settled beyond empty)
-- holds its level at that later time; its level at now is below it by the refill between,
-- negative while it owes. Sets the bucket to `level` units at now: a negative level is
-- written as the level it will have once it owes nothing, at that time.
local function set_level_now(s, level)
  local now = s.last - s.paused
  if level >= 0 then
    s.level, s.last, s.paused = level, now, 0
  else
    local ahead = ceil_div(-level, s.rate)
    s.level, s.last, s.paused = level + ahead * s.rate, now + ahead, ahead
  end
end

-- Gives back counting what the bucket owes, so that a booking given back is its turn given
-- back to whoever comes next, never tokens ahead of their time.
function TOKEN_BUCKET.refund(s, e)
  if s.paused == 0 then
    s.level = math.min(s.capacity, s.level + e.cost)
  else
    set_level_now(s, math.min(s.capacity, s.level - s.paused * s.rate + e.cost))
  end
end

-- The units a take may have owing at most `most` past empty (see book_one in cells.lua).
function TOKEN_BUCKET.room(s, most)
  return s.level - s.paused * s.rate + most
end

function TOKEN_BUCKET.owe(s, e)
  set_level_now(s, s.level - s.paused * s.rate - e.cost)
  return s.paused
end

function TOKEN_BUCKET.may(s)
  may_write('SET', s.key, '0 0', 'PX', 1)
end

TOKEN_BUCKET.write = write_state

function TOKEN_BUCKET.answer(s)
  local reset = 0
  if s.level < s.capacity then
    reset = add(s.paused, ceil_div(s.capacity - s.level, s.rate))
  end
  return floor_div(s.level, s.unit), reset
end

function TOKEN_BUCKET.ttl(s)
  return add(s.ttl, s.paused)
end
