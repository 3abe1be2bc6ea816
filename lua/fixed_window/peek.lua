-- fixed_window/peek.lua: the decision take would make, writing nothing (rl_peek).
-- KEYS[1] this window's count; ARGV as take_one.lua's. Replies as take_one.lua.
return decide_one(FIXED_WINDOW, false)
