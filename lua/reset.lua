-- reset.lua: forgets a bucket (a full one again), a window's counts or a lease set
-- (every lease): rl_reset. One write, UNLINK where the ACL allows it: a log or a lease set
-- may hold 100,000 members, which a DEL frees on Redis's main thread (milliseconds).
-- KEYS  the keys of the subject's state (a sliding window: two). Returns {1 if there was
-- state to forget, else 0}.
if delete_keys(unpack(KEYS)) > 0 then
  return {1}
end
return {0}
