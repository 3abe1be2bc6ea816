-- bench/tutorial_bucket.lua: the token bucket that every Redis tutorial writes, the
-- baseline bench/run measures Redis's cost per decision and memory per subject against.
-- Redis TIME, HMGET of tokens and timestamp, refill in floats, HSET of both, PEXPIRE.
-- KEYS[1] the bucket; ARGV: capacity, tokens per ms, cost, TTL in ms.
-- Replies {allowed (0|1), tokens left}.
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {allowed, math.floor(tokens)}
