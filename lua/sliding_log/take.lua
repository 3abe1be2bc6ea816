-- sliding_log/take.lua: takes cost from the log if the window holds room for it
-- (rl_consume). Writes only when granted.
-- KEYS[1]  the log
-- ARGV     "now" in ms for tests (empty: Redis TIME), capacity, cost, window in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
return decide_one(SLIDING_LOG, true)
