-- fixed_window/common.lua: the fixed window as peek, refund and the group script use it
-- (after lib.lua; take_one.lua, rl_consume's take without rollover, inlines it).
-- algorithm/fixed_window.c is the same in C.
--
-- Each window counts in a key of its own (PostgreSQL chose the window and named the
-- key): one integer, written with a TTL that outlives the window's end a little. A
-- missing key is a count of 0. No clock: PostgreSQL said how long the window has left.
--
-- Rollover (the policy's rollover column, > 0): what the previous window left unused, at
-- most rollover tokens, is carried into this one. Its key then holds "count:carried", the
-- carried tokens fixed at the window's first write, so this window's limit never changes
-- once it has begun; the previous window's key (named too) lives through this window for
-- that first write to read. A previous window never written to left all of it unused.
--
-- Each check takes 2 keys (this window's, the previous one's) and 5 arguments:
-- capacity, cost, ms left in the window, the key's TTL, rollover (0: none).

local FIXED_WINDOW = {nkeys = 2, nargs = 5}

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

function FIXED_WINDOW.load(k, a)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    left = tonumber(ARGV[a + 2]),
    ttl = tonumber(ARGV[a + 3]),
    rollover = tonumber(ARGV[a + 4]),
  }
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
