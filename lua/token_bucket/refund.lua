-- token_bucket/refund.lua: gives tokens back to a bucket, never above capacity
-- (rl_refund, and a rolled-back rl_reserve).
-- KEYS[1]  the bucket
-- KEYS[2]  optional: a key that marks this refund as done, so that a retried refund
--          credits nothing (it lives a minute at most)
-- ARGV     "now" (empty: Redis TIME), then capacity units, rate, unit, amount in tokens,
--          TTL in ms
-- Replies {1 when given back (0 when KEYS[2] showed it was done already), remaining,
-- 0, reset_after_ms}.
return refund_one(TOKEN_BUCKET)
