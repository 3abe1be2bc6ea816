-- sliding_log/take.lua: takes cost from the log if the window holds room for it
-- (rl_consume). Writes only when granted.
-- KEYS[1]  the log
-- ARGV     "now" in ms for tests (empty: Redis TIME), capacity, cost, window in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
expect_args(1 + SLIDING_LOG.nargs)
local s = SLIDING_LOG.load(1, 2, checked_clock(ARGV[1]))
local allowed = 0
if SLIDING_LOG.try(s, s) then
  allowed = 1
  SLIDING_LOG.write(s)
else
  s.granted = false
end
return answer_of(SLIDING_LOG, s, s, allowed)
