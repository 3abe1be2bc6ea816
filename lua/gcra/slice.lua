-- gcra/slice.lua: a slice of a hot subject's tokens for this server's allowance: the
-- take's keys and numbers, then the most tokens to take (see slice_one in cells.lua).
-- Replies {tokens taken (0: denied), remaining, retry_after_ms, reset_after_ms}.
return slice_one(GCRA)
