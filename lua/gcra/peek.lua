-- gcra/peek.lua: the decision take would make, writing nothing (rl_peek).
-- KEYS[1] the arrival time; ARGV as take_one.lua's. Replies as take_one.lua.
return decide_one(GCRA, false)
