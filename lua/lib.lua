-- lib.lua: the helpers every script shares. The build (dev/lua-script) puts this file
-- before each script, so each is one self-contained EVAL body.
--
-- A script that fails halfway keeps what it wrote (Redis has no rollback), so every
-- script makes all its checks before its first write, and a command the ACL refuses
-- is answered with the error "NOPERM <COMMAND>".

-- True for an error that says the ACL refused a command.
local function is_refused(err)
  return string.find(err, 'NOPERM', 1, true) == 1 or string.find(err, "can't run", 1, true)
    or string.find(err, "can't access", 1, true)
end

-- Raises a Redis error reply; one that says the ACL refused names the command.
local function raise(reply, command)
  if is_refused(reply.err) then
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

-- The command that deletes keys: UNLINK, which frees a big value off Redis's main thread
-- (a DEL of a sorted set of 10,000 members holds it for milliseconds), or DEL where the ACL
-- allows only that (Redis 7 tells in advance; delete_keys tries UNLINK on Redis 6).
local function delete_command(...)
  if redis.acl_check_cmd and not redis.acl_check_cmd('UNLINK', ...) then
    return 'DEL'
  end
  return 'UNLINK'
end

-- Deletes keys (see delete_command); answers how many there were.
local function delete_keys(...)
  local command = delete_command(...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    if command == 'UNLINK' and is_refused(reply.err) then
      return call('DEL', ...)
    end
    raise(reply, command)
  end
  return reply
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
