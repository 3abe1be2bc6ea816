-- concurrency/common.lua: what acquire, release and peek share (after lib.lua).
--
-- At most `capacity` leases held at once per subject. Each lease is a member of a
-- sorted set scored by its expiry, so a lease whose holder died expires by itself
-- (the TTL backstop); its holder normally releases it much earlier. Leases are counted
-- without removing the expired ones, so that every check comes before the first write.
-- A set may hold many leases (a transaction can take 100,000): every command here is
-- O(log N), and a write removes at most TRIM_MOST expired leases, so no call's work grows
-- with the set (Redis serves everyone else meanwhile).
--
-- KEYS[1]  the lease set
-- ARGV     "now" in ms for tests (empty: Redis TIME), capacity (leases), lease TTL in
--          ms, the lease id (empty for a peek)
-- Replies {allowed (acquired, released, or would acquire: 0|1), free leases after this,
--          retry_after_ms (until the soonest lease expires, when none is free),
--          reset_after_ms (until every lease held now has expired)}.
expect_args(4)
local key = KEYS[1]
local now = now_ms(ARGV[1])
local capacity = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local id = ARGV[4]
-- Leases scored at or before now have expired: "(now" is the first live score.
local live = string.format('(%d', now)
local expired = string.format('%d', now)

-- The reply, with held the leases live after this call.
local function lease_reply(allowed, held, waits)
  local free = capacity - held
  if free < 0 then
    free = 0
  end
  local retry_after = 0
  local reset_after = 0
  if held > 0 then
    local last = call('ZREVRANGEBYSCORE', key, '+inf', live, 'WITHSCORES', 'LIMIT', 0, 1)
    reset_after = math.max(tonumber(last[2]) - now, 0)
    if allowed == 0 and waits then
      local first = call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      retry_after = math.max(tonumber(first[2]) - now, 1)
    end
  end
  return {allowed, free, retry_after, reset_after}
end

local held = call('ZCOUNT', key, live, '+inf')

-- The most expired leases one call removes: more than a call adds, so they never pile up.
local TRIM_MOST = 32

-- Removes the soonest expired leases, at most TRIM_MOST of them.
local function trim_expired()
  local gone = call('ZRANGEBYSCORE', key, '-inf', expired, 'LIMIT', 0, TRIM_MOST)
  if #gone > 0 then
    call('ZREM', key, unpack(gone))
  end
end
