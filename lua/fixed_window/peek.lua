-- fixed_window/peek.lua: the decision take would make, writing nothing (rl_peek,
-- rl_usage), and the window's limit (the capacity and what it carried over).
-- KEYS and ARGV as common.lua's check (after the clock, unused).
-- Replies {allowed (0|1), remaining, retry_after_ms, reset_after_ms, limit}.
local s = load_one(FIXED_WINDOW, 0)
local reply = decide_one(FIXED_WINDOW, false, s)
reply[5] = s.limit
return reply
