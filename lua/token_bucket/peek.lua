-- token_bucket/peek.lua: the decision take would make, writing nothing (rl_peek).
-- KEYS[1]  the bucket
-- ARGV     "now" in ms for tests (empty: Redis TIME), then capacity units, rate, unit,
--          cost in tokens, TTL in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
return decide_one(TOKEN_BUCKET, false)
