-- reset.lua: forgets a bucket (a full one again), a window's counts or a lease set
-- (every lease): rl_reset. One write.
-- KEYS  the keys of the subject's state (a sliding window: two). Returns {1 if there was
-- state to forget, else 0}.
if call('DEL', unpack(KEYS)) > 0 then
  return {1}
end
return {0}
