-- group.lua: every check of rl_consume_all in one atomic step, all granted or none
-- charged, whatever their algorithms. Composed after lib.lua, cells.lua and every
-- algorithm's common.lua, each inside a function cell_<algorithm>() that makes its cell
-- (dev/lua-script), which it drives: load a check's state, try its cost, undo a try,
-- write, answer.
-- KEYS     each check's keys, in order (a sliding window: two)
-- ARGV[1]  "now" in ms for tests; empty means Redis TIME (asked once, if at all)
-- ARGV     then per check: its algorithm's tag (algorithm/*.c: LimitOps.tag), its numbers
-- Replies 4 numbers per check: allowed (0|1), remaining, retry_after_ms, reset_after_ms.
-- A check whose state another check named already shares it, so their costs add up;
-- a denial takes nothing and writes nothing, and its wait counts from what is left after
-- the checks before it.
local MAKERS = {cell_token_bucket, cell_gcra, cell_fixed_window, cell_sliding_window,
                cell_sliding_log, function() return cell_fixed_window().ROLLOVER end}
local CELLS = {}
local now = nil
local checks, states, order = {}, {}, {}
local k, a = 1, 2
while a <= #ARGV do
  local tag = tonumber(ARGV[a])
  local X = CELLS[tag]
  if X == nil and MAKERS[tag] then
    X = MAKERS[tag]()
    CELLS[tag] = X
  end
  if X == nil or a + X.nargs > #ARGV or k + X.nkeys - 1 > #KEYS then
    error({err = 'ERR ratelimit group script called with arguments that do not match its keys'})
  end
  if X.clock and now == nil then
    now = checked_clock(ARGV[1])
  end
  local e = X.load(k, a + 1, now)
  e.X = X
  if states[e.key] == nil then
    states[e.key] = e
    order[#order + 1] = e
  end
  e.state = states[e.key]
  checks[#checks + 1] = e
  k = k + X.nkeys
  a = a + 1 + X.nargs
end
if k ~= #KEYS + 1 then
  error({err = 'ERR ratelimit group script called with arguments that do not match its keys'})
end

local all = true
for i = 1, #checks do
  local e = checks[i]
  e.granted = e.X.try(e.state, e)
  if not e.granted then
    all = false
  end
end
if all then
  -- Each state is one write; with several, the ACL is asked first for every one.
  if #order > 1 then
    for i = 1, #order do
      order[i].X.may(order[i])
    end
  end
  for i = 1, #order do
    order[i].X.write(order[i])
  end
else
  for i = #checks, 1, -1 do
    local e = checks[i]
    if e.granted then
      e.X.undo(e.state, e)
    end
  end
end
local reply = {}
for i = 1, #checks do
  local e = checks[i]
  local one = answer_of(e.X, e.state, e, all and 1 or 0)
  for j = 1, 4 do
    reply[4 * (i - 1) + j] = one[j]
  end
end
return reply
