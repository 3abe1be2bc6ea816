-- fixed_window/take_one.lua: rl_consume's take of one window (composed after lib.lua
-- only): INCRBY counts the cost in; a new window's key gets its TTL; a count past the
-- capacity takes the cost out again (the same command, so the same ACL). Most calls are
-- one command and no clock, since one Redis core serves every server that shares the
-- budget. The same state and answers as the group script's fixed-window checks.
-- KEYS[1]  this window's count (PostgreSQL chose the window)
-- ARGV     "now" (unused: the window is chosen), capacity, cost, ms left in the window,
--          the key's TTL in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms}.
if #ARGV ~= 5 then
  return expect_args(5)
end
local key = KEYS[1]
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local left = tonumber(ARGV[4])
local count = redis.pcall('INCRBY', key, cost)
if type(count) == 'table' then
  if string.find(count.err, 'not an integer', 1, true) or string.find(count.err, 'WRONGTYPE', 1, true) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  raise(count, 'INCRBY')
end
if count == cost then
  -- The first take of this window: the key lives until the window is over.
  if redis.acl_check_cmd and not redis.acl_check_cmd('PEXPIRE', key, ARGV[5]) then
    call('INCRBY', key, -cost)
    error({err = 'NOPERM PEXPIRE'})
  end
  call('PEXPIRE', key, ARGV[5])
end
if count > capacity then
  -- The count before this take, exactly (count itself may pass 2^53, past what a double holds).
  local before = call('INCRBY', key, -cost)
  return {0, math.max(capacity - before, 0), left, left}
end
return {1, capacity - count, 0, left}
