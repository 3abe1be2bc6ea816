-- fixed_window/owe.lua: a take settled up beyond the window's capacity (rl_settle): see
-- owe_one in cells.lua; the debt lasts until the window ends.
-- KEYS and ARGV as take_one.lua's, then max_debt in tokens.
-- Replies {tokens taken, remaining, ms until it owes nothing, reset_after_ms}.
-- A ROLLOVER check (common.lua) when its numbers say so.
return owe_one(fixed_cell(1))
