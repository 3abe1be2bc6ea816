-- fixed_window/peek.lua: the decision take would make, writing nothing (rl_peek, rl_usage).
-- KEYS[1] this window's count; ARGV as take_one.lua's. Replies as take_one.lua. With
-- rollover (common.lua's ROLLOVER check), the window's limit follows: the capacity and what
-- it carried over.
local X = fixed_cell(0)
local s = load_one(X, 0)
local reply = decide_one(X, false, s)
if X == ROLLOVER then
  reply[5] = s.limit
end
return reply
