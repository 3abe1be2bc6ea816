-- sliding_window/common.lua: the sliding window counter as take, peek, refund and the
-- group script use it (after lib.lua). algorithm/sliding_window.c is the same in C.
--
-- Windows aligned to the epoch each count in a key of their own, as fixed_window's do
-- (PostgreSQL chose them and named the keys: this window's, the previous one's). A
-- request `elapsed` ms into this window sees previous * (window - elapsed) / window +
-- current; the comparison is multiplied out by the window, all integers
-- (capacity * window < 2^51, so every product here is exact).
--
-- Each check takes 2 keys (this window's count, the previous one's) and 4 arguments:
-- capacity, cost, window in ms, ms elapsed in this window. This window's key lives until
-- the next one ends (it is the previous one then), and a second more, as
-- algorithm/window.h's WINDOW_KEY_MARGIN_MS.

local SLIDING_WINDOW = {nkeys = 2, nargs = 4}

function SLIDING_WINDOW.load(k, a)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    window = tonumber(ARGV[a + 2]),
    elapsed = tonumber(ARGV[a + 3]),
  }
  s.left = s.window - s.elapsed
  s.ttl = s.left + s.window + 1000
  local values = call('MGET', KEYS[k], KEYS[k + 1])
  s.count = stored_count(values[1])
  s.previous = stored_count(values[2])
  return s
end

-- previous * (window - elapsed) + count * window: the weighted count, times the window.
local function sliding_used(s, count)
  return s.previous * (s.window - s.elapsed) + count * s.window
end

function SLIDING_WINDOW.try(s, e)
  if sliding_used(s, s.count + e.cost) <= s.capacity * s.window then
    s.count = s.count + e.cost
    return true
  end
  local room = s.capacity - s.count - e.cost
  if room >= 0 then
    -- Within this window, once the previous one weighs little enough.
    e.retry = s.window - floor_div(room * s.window, s.previous) - s.elapsed
  else
    -- In the next window, where this one's count is the previous.
    e.retry = s.left + s.window - floor_div((s.capacity - e.cost) * s.window, s.count)
  end
  return false
end

function SLIDING_WINDOW.undo(s, e)
  s.count = s.count - e.cost
end

function SLIDING_WINDOW.refund(s, e)
  s.count = math.max(s.count - e.cost, 0)
end

function SLIDING_WINDOW.may(s)
  may_write_count(s.key)
end

function SLIDING_WINDOW.ttl(s)
  return s.ttl
end

function SLIDING_WINDOW.write(s)
  write_count(s.key, s.count, s.ttl)
end

function SLIDING_WINDOW.answer(s)
  local used = sliding_used(s, s.count)
  local all = s.capacity * s.window
  local remaining = 0
  if used < all then
    remaining = floor_div(all - used, s.window)
  end
  local reset = 0
  if s.count > 0 then
    reset = s.left + s.window
  elseif s.previous > 0 then
    reset = s.left
  end
  return remaining, reset
end
