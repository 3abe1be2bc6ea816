-- concurrency/acquire.lua: takes one lease when fewer than capacity are held
-- (rl_acquire). The lease is the first write, so that under OOM it is refused with
-- nothing written.
if held >= capacity then
  return lease_reply(0, held, true)
end
local expiry = now + ttl
may_write('ZADD', key, expiry, id)
may_write('ZREM', key, id)
may_write('PEXPIRE', key, ttl)
call('ZADD', key, expiry, id)
trim_expired()
-- The set lives as long as its longest lease, even one taken under a longer TTL.
local longest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
call('PEXPIRE', key, math.max(ttl, tonumber(longest[2]) - now))
return lease_reply(1, held + 1, true)
