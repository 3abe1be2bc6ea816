-- fixed_window/book.lua: a take that may wait (rl_consume's max_wait): granted in this
-- window when the cost fits; else, when this window ends at most max_wait ms from now,
-- booked in the next window if it fits there (the next window's count holds it, so the
-- next window grants no more than its capacity); else denied as a take is.
-- KEYS[1]  this window's count, KEYS[2] the next window's
-- ARGV     the clock (unused), this window's 4 numbers (as take_one.lua's), the next
--          window's 4, max_wait in ms, max_debt in tokens (unused: a window owes nothing)
-- Replies {allowed (0|1), remaining, retry_after_ms, reset_after_ms, wait_ms}.
expect_args(11)
local s = FIXED_WINDOW.load(1, 2)
local n = FIXED_WINDOW.load(2, 6)
local max_wait = tonumber(ARGV[10])
if not is_exact(max_wait) then
  error({err = 'ERR ratelimit wait or debt is not a whole number'})
end
FIXED_WINDOW.may(s)
FIXED_WINDOW.may(n)
if FIXED_WINDOW.try(s, s) then
  FIXED_WINDOW.write(s)
  local reply = answer_of(FIXED_WINDOW, s, s, 1)
  reply[5] = 0
  return reply
end
s.granted = false
if s.left <= max_wait and FIXED_WINDOW.try(n, n) then
  FIXED_WINDOW.write(n)
  -- What this window still answers: it lends nothing to the next.
  local remaining, reset = FIXED_WINDOW.answer(s)
  return {1, remaining, 0, reset, s.left}
end
local reply = answer_of(FIXED_WINDOW, s, s, 0)
reply[5] = 0
return reply
