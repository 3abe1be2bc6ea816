-- fixed_window/common.lua: the fixed window as peek, refund and the group script use it
-- (after lib.lua; take_one.lua, rl_consume's take, inlines it). algorithm/fixed_window.c
-- is the same in C.
--
-- Each window counts in a key of its own (PostgreSQL chose the window and named the
-- key): one integer, written with a TTL that outlives the window's end a little. A
-- missing key is a count of 0. No clock: PostgreSQL said how long the window has left.
--
-- Each check takes 4 arguments: capacity, cost, ms left in the window, the key's TTL.

local FIXED_WINDOW = {nkeys = 1, nargs = 4}

function FIXED_WINDOW.load(k, a)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    left = tonumber(ARGV[a + 2]),
    ttl = tonumber(ARGV[a + 3]),
  }
  local value = redis.pcall('GET', s.key)
  if type(value) == 'table' then
    raise(value, 'GET')
  end
  s.count = stored_count(value)
  return s
end

function FIXED_WINDOW.try(s, e)
  if s.count + e.cost <= s.capacity then
    s.count = s.count + e.cost
    return true
  end
  e.retry = s.left
  return false
end

function FIXED_WINDOW.undo(s, e)
  s.count = s.count - e.cost
end

function FIXED_WINDOW.refund(s, e)
  s.count = math.max(s.count - e.cost, 0)
end

-- The tokens a settle may take owing at most `most` past the capacity (cells.lua's
-- owe_one): a window's debt lasts until the window ends. (A wait books the next window
-- instead: fixed_window/book.lua.)
function FIXED_WINDOW.room(s, most)
  return s.capacity + most - s.count
end

function FIXED_WINDOW.owe(s, e)
  s.count = s.count + e.cost
  if s.count > s.capacity then
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

function FIXED_WINDOW.write(s)
  write_count(s.key, s.count, s.ttl)
end

function FIXED_WINDOW.answer(s)
  local reset = 0
  if s.count > 0 then
    reset = s.left
  end
  return math.max(s.capacity - s.count, 0), reset
end
