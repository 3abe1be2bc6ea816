-- token_bucket/book.lua: a take that may wait (rl_consume's max_wait): see book_one in cells.lua.
-- KEYS and ARGV as take_one.lua's, then max_wait in ms and max_debt in tokens.
-- Replies {allowed (0|1), remaining, retry_after_ms, reset_after_ms, wait_ms}.
return book_one(TOKEN_BUCKET)
