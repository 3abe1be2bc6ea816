-- lib.lua: the helpers every script shares. The build (dev/lua-script) puts this file
-- before each script, so each is one self-contained EVAL body.
--
-- A script that fails halfway keeps what it wrote (Redis has no rollback), so every
-- script makes all its checks before its first write, and a command the ACL refuses
-- is answered with the error "NOPERM <COMMAND>".

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

-- Raises unless the script was given exactly count arguments.
local function expect_args(count)
  if #ARGV ~= count then
    error({err = 'ERR ratelimit script called with ' .. #ARGV .. ' arguments, not ' .. count})
  end
end

-- Now in ms since the epoch: the test clock arg when it is not empty, else Redis TIME.
local function now_ms(arg)
  if arg ~= nil and arg ~= '' then
    return tonumber(arg)
  end
  local t = call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end


-- Largest integer a double holds exactly; sums that could pass it saturate there.
local EXACT_MAX = 9007199254740991

-- True for a whole number in [0, EXACT_MAX] (false for nil, nan, inf, 1.5, 1e20 ...).
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

-- The clock the state sees, checked: a whole number of ms.
local function checked_clock(arg)
  local now = now_ms(arg)
  if not is_exact(now) then
    error({err = 'ERR ratelimit clock is not a whole number of ms'})
  end
  return now
end

-- A stored count (a window's), checked: a missing key is 0.
local function stored_count(value)
  if not value then
    return 0
  end
  local count = tonumber(value)
  if not is_exact(count) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return count
end

-- The reply of one check of a cell algorithm (see group.lua): {allowed, remaining,
-- retry_after_ms, reset_after_ms}.
local function answer_of(X, s, e, allowed)
  local remaining, reset = X.answer(s)
  local retry = 0
  if allowed == 0 and e.granted == false then
    retry = e.retry
  end
  return {allowed, remaining, retry, reset}
end

-- Runs the mark of a refund done once (KEYS[mark]): true when this refund may credit.
-- The mark only has to outlive a retry of this refund: a minute at most.
local function refund_once(mark, ttl)
  if mark == nil then
    return true
  end
  return call('SET', mark, '1', 'NX', 'PX', math.max(1, math.min(ttl, 60000)))
end

-- rl_peek of one check of cell algorithm X (its common.lua): KEYS its keys, ARGV the
-- clock then its numbers. The decision a take would make, nothing written.
local function peek_one(X)
  expect_args(1 + X.nargs)
  local now = X.clock and checked_clock(ARGV[1]) or nil
  local s = X.load(1, 2, now)
  local allowed = 0
  if X.try(s, s) then
    allowed = 1
    X.undo(s, s)
  else
    s.granted = false
  end
  return answer_of(X, s, s, allowed)
end

-- rl_refund of one check of cell algorithm X: gives its cost back, never beyond what
-- an untouched state holds. KEYS its keys, then optionally a mark that makes the refund
-- happen once; answers {1 when given back (0 when the mark showed it was done already),
-- remaining, 0, reset_after_ms}.
local function refund_one(X)
  expect_args(1 + X.nargs)
  local now = X.clock and checked_clock(ARGV[1]) or nil
  local s = X.load(1, 2, now)
  local mark = KEYS[X.nkeys + 1]
  local done = 0
  if mark ~= nil then
    may_write('SET', mark, '1', 'NX', 'PX', 1)
    X.may(s)
  end
  if refund_once(mark, X.ttl(s)) then
    X.refund(s, s)
    X.write(s)
    done = 1
  end
  s.granted = true
  return answer_of(X, s, s, done)
end
