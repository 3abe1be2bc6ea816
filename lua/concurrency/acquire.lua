-- concurrency/acquire.lua: takes one lease when fewer than capacity are held (rl_acquire),
-- and, with the queue, when no waiter is ahead of this one (common.lua). A waiter that is
-- not served yet keeps its place (its ticket renewed). The lease is the first write to the
-- lease set, so that under OOM it is refused with nothing taken.
queue_may()
local waiting = queue_length(true)
local ahead = waiting
local arrival = nil
if ticket ~= '' then
  arrival = call('ZSCORE', queue, ticket)
  if arrival then
    ahead = queue_ahead(arrival)
  end
end
if held + ahead >= capacity then
  if ticket ~= '' then
    if not arrival then
      call('ZADD', queue, now, ticket)
    end
    call('ZADD', alive, now + ticket_ttl, ticket)
    call('PEXPIRE', queue, ticket_ttl * 2)
    call('PEXPIRE', alive, ticket_ttl * 2)
  end
  return lease_reply(0, held, true)
end
local expiry = now + ttl
may_write('ZADD', key, expiry, id)
may_write('ZREM', key, id)
may_write('PEXPIRE', key, ttl)
call('ZADD', key, expiry, id)
if arrival then
  call('ZREM', queue, ticket)
  call('ZREM', alive, ticket)
end
trim_expired()
-- The set lives as long as its longest lease, even one taken under a longer TTL.
local longest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
call('PEXPIRE', key, math.max(ttl, tonumber(longest[2]) - now))
return lease_reply(1, held + 1, true)
