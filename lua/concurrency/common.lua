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
-- Waiters (rl_acquire's max_wait) queue in arrival order: a sorted set of tickets scored
-- by arrival (KEYS[2]) and one scored by expiry (KEYS[3]), which each try renews; a ticket
-- not renewed in time (a waiter gone) is dropped by the next calls. A lease goes to a ticket only when fewer tickets are ahead of it than leases
-- are free, and to a take without a ticket only when more are free than tickets wait.
--
-- KEYS[1]  the lease set; then, with the queue, KEYS[2] its tickets and KEYS[3] their expiries
-- ARGV     "now" in ms for tests (empty: Redis TIME), capacity (leases), lease TTL in
--          ms, the lease id (empty for a peek); with the queue, the waiter's ticket (empty:
--          none) and how long a ticket lives unrenewed, in ms
-- Replies {allowed (acquired, released, or would acquire: 0|1), free leases after this,
--          retry_after_ms (until the soonest lease expires, when none is free),
--          reset_after_ms (until every lease held now has expired)}.
if #ARGV ~= 4 then
  expect_args(6)
end
local key = KEYS[1]
local now = now_ms(ARGV[1])
local capacity = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local id = ARGV[4]
local queue, alive = KEYS[2], KEYS[3]
local ticket = ARGV[5] or ''
local ticket_ttl = tonumber(ARGV[6] or '0')
if ticket ~= '' and (alive == nil or not is_exact(ticket_ttl) or ticket_ttl < 1) then
  error({err = 'ERR ratelimit lease ticket without its queue or its lifetime'})
end
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

-- The most gone tickets one call drops: more than a call adds, so they never pile up.
local QUEUE_TRIM_MOST = 32

-- How many tickets wait (their waiters not gone: renewed in time), read without a write, so
-- that a lease is still the first write of acquire (0 without a queue).
local function queue_length()
  if queue == nil then
    return 0
  end
  return call('ZCOUNT', alive, '(' .. string.format('%d', now), '+inf')
end

-- The tickets that arrived before one that arrived at arrival (ZSCORE's text), gone ones
-- among them until they are dropped.
local function queue_ahead(arrival)
  return call('ZCOUNT', queue, '-inf', '(' .. arrival)
end

-- Drops tickets whose waiters have gone (not renewed in time), at most QUEUE_TRIM_MOST of
-- them, and a ticket at the front that has no expiry (one set lost without the other: it
-- would hold the queue for ever). Writes only: after a call's first write. (Only the
-- commands the lease set needs: the Redis user of docs/operations.md may run them.)
local function queue_trim()
  if queue == nil then
    return
  end
  local gone = call('ZRANGEBYSCORE', alive, '-inf', string.format('%d', now), 'LIMIT', 0, QUEUE_TRIM_MOST)
  if #gone > 0 then
    call('ZREM', queue, unpack(gone))
    call('ZREM', alive, unpack(gone))
  end
  local front = call('ZRANGE', queue, 0, 0)
  if #front > 0 and not call('ZSCORE', alive, front[1]) then
    call('ZREM', queue, front[1])
  end
end

-- Before the first write: that the queue's writes may run.
local function queue_may()
  if queue ~= nil then
    may_write('ZADD', queue, 0, 'x')
    may_write('ZREM', queue, 'x')
    may_write('ZADD', alive, 0, 'x')
    may_write('ZREM', alive, 'x')
    may_write('PEXPIRE', queue, 1)
    may_write('PEXPIRE', alive, 1)
  end
end
