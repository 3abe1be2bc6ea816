-- concurrency/leave.lua: a waiter leaves the queue (its max_wait ended, or it was
-- cancelled): its ticket is dropped at once, so that those behind it move up.
-- KEYS and ARGV as common.lua's with the queue (the ticket in ARGV[5]).
-- Replies as common.lua says (allowed 1 when the ticket was waiting).
queue_may()
local left = 0
if ticket ~= '' and call('ZREM', queue, ticket) == 1 then
  left = 1
end
if ticket ~= '' then
  call('ZREM', alive, ticket)
end
return lease_reply(left, held, false)
