-- token_bucket/take.lua: takes cost tokens from every bucket named, all or none
-- (rl_consume: one bucket; rl_consume_all: several, one hash tag).
-- KEYS[1..n]  the buckets
-- ARGV[1]     "now" in ms for tests; empty means Redis TIME
-- ARGV[2..]   5 per bucket: capacity units, rate, unit, cost in tokens, TTL in ms
expect_args(1 + 5 * #KEYS)
local now = bucket_clock(ARGV[1])
local buckets = load_buckets(now)
local all = decide(buckets)
local allowed = {}
if all then
  -- Each bucket is one write; with several, the ACL is asked first for every one.
  if #buckets > 1 then
    for i = 1, #buckets do
      may_write('SET', buckets[i].key, '0 0', 'PX', 1)
    end
  end
  for i = 1, #buckets do
    if not buckets[i].same then
      write_state(buckets[i])
    end
  end
else
  -- A denial takes nothing and writes nothing: the stored state refills the same.
  put_back(buckets)
end
for i = 1, #buckets do
  allowed[i] = all and 1 or 0
end
return reply_of(buckets, allowed)
