-- fixed_window/common.lua: the fixed window as peek, refund and the group script use it
-- (after lib.lua; take_one.lua, rl_consume's take without rollover, inlines it).
-- algorithm/fixed_window.c is the same in C.
--
-- Each window counts in a key of its own (PostgreSQL chose the window and named the
-- key): one integer, written with a TTL that outlives the window's end a little. A
-- missing key is a count of 0. No clock: PostgreSQL said how long the window has left.
--
-- Each check takes 1 key and 4 arguments: capacity, cost, ms left in the window, the key's
-- TTL.
--
-- Rollover (the policy's rollover column): what the previous window left unused, at most
-- rollover tokens, is carried into this one. Such a check is the cell ROLLOVER: 2 keys
-- (this window's, the previous one's) and a 5th argument, rollover. Its window's key holds
-- "count:carried", the carried tokens fixed at the window's first write, so the window's
-- limit never changes once it has begun; the previous window's key lives through this
-- window for that first write to read. A previous window never written to left all of it
-- unused. (PostgreSQL names these windows' keys apart from plain ones.)

local FIXED_WINDOW = {nkeys = 1, nargs = 4}
local ROLLOVER = setmetatable({nkeys = 2, nargs = 5}, {__index = FIXED_WINDOW})
FIXED_WINDOW.ROLLOVER = ROLLOVER

-- A window's stored value: its count and the tokens carried into it (a missing key: 0, 0).
local function window_value(value)
  if not value then
    return 0, 0
  end
  local count, carried = string.match(value, '^(%d+):(%d+)$')
  if count == nil then
    return stored_count(value), 0
  end
  count, carried = tonumber(count), tonumber(carried)
  if not is_exact(count) or not is_exact(carried) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return count, carried
end

local function get_value(key)
  local value = redis.pcall('GET', key)
  if type(value) == 'table' then
    raise(value, 'GET')
  end
  return value
end

-- A check's state: KEYS from k, ARGV from a; with rollover, its 5th number and the
-- previous window's key.
local function load_window(k, a, rollover)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    left = tonumber(ARGV[a + 2]),
    ttl = tonumber(ARGV[a + 3]),
    rollover = rollover and tonumber(ARGV[a + 4]) or 0,
  }
  if not is_exact(s.rollover) or s.rollover < 0 then
    error({err = 'ERR ratelimit rollover is not a whole number'})
  end
  local value = get_value(s.key)
  s.count, s.carried = window_value(value)
  if not value and s.rollover > 0 then
    -- This window's first write fixes what it carries: the previous window's unused part.
    local previous = get_value(KEYS[k + 1])
    s.carried = s.rollover
    if previous then
      local count, carried = window_value(previous)
      s.carried = math.min(s.rollover, math.max(s.capacity + carried - count, 0))
    end
  end
  s.limit = s.capacity + s.carried
  return s
end

function FIXED_WINDOW.load(k, a)
  return load_window(k, a, false)
end

function ROLLOVER.load(k, a)
  return load_window(k, a, true)
end

-- The cell of a script's one check: ROLLOVER when ARGV holds its 5 numbers (after the clock,
-- then `extra` more), else FIXED_WINDOW.
local function fixed_cell(extra)
  if #ARGV == 1 + ROLLOVER.nargs + extra then
    return ROLLOVER
  end
  return FIXED_WINDOW
end

function FIXED_WINDOW.try(s, e)
  if s.count + e.cost <= s.limit then
    s.count = s.count + e.cost
    return true
  end
  e.retry = s.left
  return false
end

function FIXED_WINDOW.undo(s, e)
  s.count = s.count - e.cost
end

-- A window that is over gives nothing back: with rollover, the next window has read it.
function FIXED_WINDOW.refund(s, e)
  if s.rollover > 0 and s.left <= 0 then
    return
  end
  s.count = math.max(s.count - e.cost, 0)
end

-- The tokens a settle may take owing at most `most` past the limit (cells.lua's
-- owe_one): a window's debt lasts until the window ends. (A wait books the next window
-- instead: fixed_window/book.lua.)
function FIXED_WINDOW.room(s, most)
  return s.limit + most - s.count
end

function FIXED_WINDOW.owe(s, e)
  s.count = s.count + e.cost
  if s.count > s.limit then
    return s.left
  end
  return 0
end

function FIXED_WINDOW.may(s)
  may_write_count(s.key)
end

function FIXED_WINDOW.ttl(s)
  return s.ttl
end

-- A window with nothing counted is no state: its carried tokens are read again from the
-- previous window, which lives as long as this one.
function FIXED_WINDOW.write(s)
  if s.carried > 0 and s.count > 0 then
    call('SET', s.key, string.format('%d:%d', s.count, s.carried), 'PX', s.ttl)
  else
    write_count(s.key, s.count, s.ttl)
  end
end

function FIXED_WINDOW.answer(s)
  local reset = 0
  if s.count > 0 then
    reset = s.left
  end
  return math.max(s.limit - s.count, 0), reset
end
