-- concurrency/acquire.lua: takes one lease when fewer than capacity are held (rl_acquire),
-- and, with the queue, when no waiter is ahead of this one (common.lua). The lease is the
-- call's first write, so that under OOM it is refused with nothing taken. A waiter that
-- is not served keeps its place (its ticket written or renewed; under OOM it is denied
-- without one, as a take that does not wait).
queue_may()
local ahead = queue_length()
local arrival = nil
if ticket ~= '' then
  arrival = call('ZSCORE', queue, ticket)
  if arrival then
    ahead = queue_ahead(arrival)
  end
end
if held + ahead >= capacity then
  if ticket ~= '' then
    local queued = redis.pcall('ZADD', alive, now + ticket_ttl, ticket)
    if type(queued) == 'table' and queued.err then
      if string.find(queued.err, 'OOM', 1, true) == 1 then
        return lease_reply(0, held, true)
      end
      raise(queued, 'ZADD')
    end
    if not arrival then
      call('ZADD', queue, now, ticket)
    end
    call('PEXPIRE', queue, ticket_ttl * 2)
    call('PEXPIRE', alive, ticket_ttl * 2)
    queue_trim()
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
queue_trim()
trim_expired()
-- The set lives as long as its longest lease, even one taken under a longer TTL.
local longest = call('ZRANGE', key, -1, -1, 'WITHSCORES')
call('PEXPIRE', key, math.max(ttl, tonumber(longest[2]) - now))
return lease_reply(1, held + 1, true)
