-- fixed_window/slice.lua: a slice of a hot subject's tokens for this server's allowance: the
-- take's keys and numbers, then the most tokens to take (see slice_one in cells.lua).
-- Replies {tokens taken (0: denied), remaining, retry_after_ms, reset_after_ms}.
-- A ROLLOVER check (common.lua) when its numbers say so.
return slice_one(fixed_cell(1))
