-- sliding_log/peek.lua: the decision take would make, writing nothing (rl_peek).
-- KEYS and ARGV as take.lua's. Replies as take.lua.
return decide_one(SLIDING_LOG, false)
