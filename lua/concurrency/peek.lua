-- concurrency/peek.lua: whether rl_acquire would get a lease now, writing nothing.
if held < capacity then
  return lease_reply(1, held, true)
end
return lease_reply(0, held, true)
