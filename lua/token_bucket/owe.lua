-- token_bucket/owe.lua: a take settled up beyond what the state holds (rl_settle): see owe_one in
-- cells.lua. KEYS and ARGV as take_one.lua's, then max_debt in tokens.
-- Replies {tokens taken, remaining, ms until it owes nothing, reset_after_ms}.
return owe_one(TOKEN_BUCKET)
