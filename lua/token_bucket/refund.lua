-- token_bucket/refund.lua: gives tokens back to a bucket, never above capacity
-- (rl_refund, and a rolled-back rl_reserve).
-- KEYS[1]  the bucket
-- KEYS[2]  optional: a key that marks this refund as done, so that a retried refund
--          credits nothing (it lives a minute at most)
-- ARGV     "now" (empty: Redis TIME), then capacity units, rate, unit, amount in tokens,
--          TTL in ms
-- Replies {1 when given back (0 when KEYS[2] showed it was done already), remaining,
-- 0, reset_after_ms}.
expect_args(6)
local now = bucket_clock(ARGV[1])
local b = load_bucket(KEYS[1], 2, now)
local ttl = add(b.ttl, b.paused)
-- The mark only has to outlive a retry of this refund: a minute at most.
local mark_ttl = math.min(ttl, 60000)
local done = 1
if KEYS[2] ~= nil then
  may_write('SET', KEYS[2], '1', 'NX', 'PX', mark_ttl)
  may_write('SET', b.key, '0 0', 'PX', ttl)
end
if KEYS[2] == nil or call('SET', KEYS[2], '1', 'NX', 'PX', mark_ttl) then
  b.level = math.min(b.capacity, b.level + b.cost)
  write_state(b)
else
  done = 0
end
b.granted = true
return reply_of({b}, {done})
