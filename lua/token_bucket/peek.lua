-- token_bucket/peek.lua: the decision take would make, writing nothing (rl_peek).
-- KEYS[1..n]  the buckets
-- ARGV[1]     "now" in ms for tests; empty means Redis TIME
-- ARGV[2..]   5 per bucket: capacity units, rate, unit, cost in tokens, TTL in ms
-- Each bucket answers whether it would grant its cost (after those before it).
expect_args(1 + 5 * #KEYS)
local now = bucket_clock(ARGV[1])
local buckets = load_buckets(now)
local all = decide(buckets)
local allowed = {}
put_back(buckets)
for i = 1, #buckets do
  allowed[i] = (all or buckets[i].granted) and 1 or 0
end
return reply_of(buckets, allowed)
