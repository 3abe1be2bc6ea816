-- fixed_window/take.lua: rl_consume's take of a window with rollover (take_one.lua is the
-- lean one without): as the group script's check, answering the window's limit too, the
-- capacity and what it carried over (rl_headers and rl_usage tell it).
-- KEYS and ARGV as common.lua's ROLLOVER check (after the clock, unused).
-- Replies {allowed (0|1), remaining, retry_after_ms, reset_after_ms, limit}.
local s = load_one(ROLLOVER, 0)
local reply = decide_one(ROLLOVER, true, s)
reply[5] = s.limit
return reply
