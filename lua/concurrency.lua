-- Concurrency leases: at most `capacity` held at once per subject. Each lease is a
-- member of a sorted set scored by its expiry, so a lease whose holder died expires
-- by itself (the TTL backstop); its holder normally releases it much earlier.
--
-- KEYS[1]  the lease set
-- ARGV[1]  capacity (leases)         ARGV[2]  lease TTL in ms
-- ARGV[3]  the lease id              ARGV[4]  optional "now" in ms (tests); empty: Redis TIME
-- ARGV[5]  mode: "acquire", "release" or "peek"
-- Returns {allowed (acquired, released, or would acquire: 0|1), free leases after this,
--          retry_after_ms (until the soonest lease expires, when none is free),
--          reset_after_ms (until every lease held now has expired)}.

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local id = ARGV[3]
local mode = ARGV[5]

local now
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Leases past their expiry are gone.
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local allowed = 0
if mode == 'release' then
  allowed = redis.call('ZREM', key, id)
else
  local held = redis.call('ZCARD', key)
  if held < capacity then
    allowed = 1
    if mode == 'acquire' then
      redis.call('ZADD', key, now + ttl, id)
      -- The set lives as long as its longest lease, even one taken under a longer TTL.
      local longest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', key, math.max(ttl, tonumber(longest[2]) - now))
    end
  end
end

local held = redis.call('ZCARD', key)
local free = capacity - held
if free < 0 then
  free = 0
end
local retry_after = 0
local reset_after = 0
if held > 0 then
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  reset_after = math.max(tonumber(last[2]) - now, 0)
  if allowed == 0 and mode ~= 'release' then
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    retry_after = math.max(tonumber(first[2]) - now, 1)
  end
end
return {allowed, free, retry_after, reset_after}
