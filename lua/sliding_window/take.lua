-- sliding_window/take.lua: takes cost from the sliding window if the weighted count
-- allows it (rl_consume). One MGET, and one SET of this window's count when granted.
-- KEYS[1]  this window's count; KEYS[2] the previous window's
-- ARGV     "now" (unused: the window is chosen), capacity, cost, window, elapsed (see
--          common.lua)
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
return decide_one(SLIDING_WINDOW, true)
