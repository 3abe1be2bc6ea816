-- Concurrency leases: at most `capacity` held at once per subject. Each lease is a
-- member of a sorted set scored by its expiry, so a lease whose holder died expires
-- by itself (the TTL backstop); its holder normally releases it much earlier.
--
-- Every check comes before the first write (Redis keeps what a failing script wrote):
-- leases are counted without removing the expired ones, and an acquire writes its
-- lease first, so that under OOM it is refused with nothing written, and a command
-- the ACL refuses is found before anything is written.
--
-- KEYS[1]  the lease set
-- ARGV[1]  capacity (leases)         ARGV[2]  lease TTL in ms
-- ARGV[3]  the lease id              ARGV[4]  optional "now" in ms (tests); empty: Redis TIME
-- ARGV[5]  mode: "acquire", "release" or "peek"
-- Returns {allowed (acquired, released, or would acquire: 0|1), free leases after this,
--          retry_after_ms (until the soonest lease expires, when none is free),
--          reset_after_ms (until every lease held now has expired)}.
-- A command the ACL refuses is answered with the error "NOPERM <COMMAND>".

local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local id = ARGV[3]
local mode = ARGV[5]

-- Raises a Redis error reply; one that says the ACL refused names the command.
local function raise(reply, command)
  local err = reply.err
  if string.find(err, 'NOPERM', 1, true) == 1 or string.find(err, "can't run", 1, true)
     or string.find(err, "can't access", 1, true) then
    error({err = 'NOPERM ' .. command})
  end
  error(reply)
end

-- Runs a Redis command, raising its error (see raise).
local function call(command, ...)
  local reply = redis.pcall(command, ...)
  if type(reply) == 'table' and reply.err then
    raise(reply, command)
  end
  return reply
end

-- Before the first write: raises NOPERM when the ACL would refuse this write
-- (Redis 7 and later can tell in advance).
local function may_write(command, ...)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, ...) then
    error({err = 'NOPERM ' .. command})
  end
end

local now
if ARGV[4] ~= nil and ARGV[4] ~= '' then
  now = tonumber(ARGV[4])
else
  local t = call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Leases scored at or before now have expired: "(now" is the first live score.
local live = string.format('(%d', now)
local expired = string.format('%d', now)

local held = call('ZCOUNT', key, live, '+inf')
local allowed = 0
if mode == 'release' then
  may_write('ZREM', key, id)
  may_write('ZREMRANGEBYSCORE', key, '-inf', expired)
  local score = call('ZSCORE', key, id)
  if score and tonumber(score) > now then
    allowed = 1
  end
  if score then
    call('ZREM', key, id)
    held = held - allowed
  end
  call('ZREMRANGEBYSCORE', key, '-inf', expired)
elseif held < capacity then
  allowed = 1
  if mode == 'acquire' then
    local expiry = now + ttl
    may_write('ZADD', key, expiry, id)
    may_write('ZREMRANGEBYSCORE', key, '-inf', expired)
    may_write('PEXPIRE', key, ttl)
    call('ZADD', key, expiry, id)
    call('ZREMRANGEBYSCORE', key, '-inf', expired)
    held = held + 1
    -- The set lives as long as its longest lease, even one taken under a longer TTL.
    local longest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    call('PEXPIRE', key, math.max(ttl, tonumber(longest[2]) - now))
  end
end

local free = capacity - held
if free < 0 then
  free = 0
end
local retry_after = 0
local reset_after = 0
if held > 0 then
  local last = call('ZREVRANGEBYSCORE', key, '+inf', live, 'WITHSCORES', 'LIMIT', 0, 1)
  reset_after = math.max(tonumber(last[2]) - now, 0)
  if allowed == 0 and mode ~= 'release' then
    local first = call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    retry_after = math.max(tonumber(first[2]) - now, 1)
  end
end
return {allowed, free, retry_after, reset_after}
