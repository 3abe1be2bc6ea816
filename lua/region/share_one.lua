-- region/share_one.lua: a take of a fixed window whose budget is split across regions
-- (engine/region.c), made in the Redis of the region that decides (composed after
-- lib.lua only). A window's capacity is split: every region but the home one grants up
-- to its base share alone, the home region the rest, and tokens of the rest leased by
-- the home region to another (region/lease_one.lua) are granted there from its lease key.
-- So every token granted anywhere in a window was counted once in one Redis, and all of
-- them together are at most the capacity (as long as each Redis keeps what it counted:
-- across a restart, with appendonly and appendfsync always; see docs/regions.md).
-- KEYS[1]  this window's count of the region's share (PostgreSQL chose the window)
-- KEYS[2]  optional: this window's lease key, "<tokens left> <tokens leased>"
-- ARGV     "now" (unused), the share, cost, ms left in the window, the key's TTL in ms
-- Replies {allowed (0|1), remaining tokens, retry_after_ms, reset_after_ms, short (1: the
-- share and the lease lack the cost: ask the home region for a lease), tokens leased}.
if #ARGV ~= 5 then
  return expect_args(5)
end
local share = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local left = tonumber(ARGV[4])
local ttl = ARGV[5]
if not (is_exact(share) and is_exact(cost) and is_exact(left)) then
  error({err = 'ERR ratelimit region numbers are not whole'})
end

local function count_of(value)
  if not value then
    return 0
  end
  local n = tonumber(value)
  if not is_exact(n) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return n
end

local count = count_of(redis.pcall('GET', KEYS[1]))
local held, leased = 0, 0
if KEYS[2] then
  local value = redis.pcall('GET', KEYS[2])
  if type(value) == 'string' then
    local a, b = string.match(value, '^(%d+) (%d+)$')
    if not a then
      error({err = 'ERR ratelimit bucket state is corrupt'})
    end
    held, leased = tonumber(a), tonumber(b)
  end
end
local room = math.max(share - count, 0)

if count + cost <= share then
  if redis.acl_check_cmd and not redis.acl_check_cmd('SET', KEYS[1], '1', 'PX', ttl) then
    error({err = 'NOPERM SET'})
  end
  -- The first write gives the key its TTL; later ones keep it, so that a server whose clock
  -- is ahead never ends the window's count early.
  if count == 0 then
    call('SET', KEYS[1], string.format('%d', count + cost), 'PX', ttl)
  else
    call('SET', KEYS[1], string.format('%d', count + cost), 'KEEPTTL')
  end
  return {1, room - cost + held, 0, left, 0, leased}
end
if held >= cost then
  call('SET', KEYS[2], string.format('%d %d', held - cost, leased), 'KEEPTTL')
  return {1, room + held - cost, 0, left, 0, leased}
end
local short = 0
if KEYS[2] then
  short = 1
end
return {0, room + held, left, left, short, leased}
