-- concurrency/peek.lua: whether rl_acquire would get a lease now, writing nothing (a lease
-- is free for a take that does not wait when more are free than waiters queue).
if held + queue_length() < capacity then
  return lease_reply(1, held, true)
end
return lease_reply(0, held, true)
