-- sliding_window/take.lua: takes cost from the sliding window if the weighted count
-- allows it (rl_consume). One MGET, and one SET of this window's count when granted.
-- KEYS[1]  this window's count; KEYS[2] the previous window's
-- ARGV     "now" (unused: the window is chosen), capacity, cost, window, elapsed (see
--          common.lua)
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
expect_args(1 + SLIDING_WINDOW.nargs)
local s = SLIDING_WINDOW.load(1, 2)
local allowed = 0
if SLIDING_WINDOW.try(s, s) then
  allowed = 1
  SLIDING_WINDOW.write(s)
else
  s.granted = false
end
return answer_of(SLIDING_WINDOW, s, s, allowed)
