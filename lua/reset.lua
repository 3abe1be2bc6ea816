-- reset.lua: forgets a bucket (a full one again) or a lease set (every lease):
-- rl_reset. One write.
-- KEYS[1]  the bucket or lease set. Returns {1 if there was state to forget, else 0}.
return {call('DEL', KEYS[1])}
