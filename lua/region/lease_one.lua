-- region/lease_one.lua: a lease of a split window's tokens for another region
-- (engine/region.c), made in the home region's Redis (composed after lib.lua only):
-- the cost and as many more as the home region's rest holds, at most `most`, counted
-- in the window at once. The region that asked holds them in its own Redis until the
-- window ends (region/deposit_one.lua).
-- KEYS[1]  this window's count of the home region's rest
-- ARGV     "now" (unused), the rest's size, cost, ms left, the key's TTL in ms, the
--          most tokens to lease
-- Replies {tokens leased (0: denied), remaining after, retry_after_ms, reset_after_ms}.
if #ARGV ~= 6 then
  return expect_args(6)
end
local rest = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local left = tonumber(ARGV[4])
local ttl = ARGV[5]
local most = tonumber(ARGV[6])
if not (is_exact(rest) and is_exact(cost) and is_exact(left) and is_exact(most))
    or most < cost then
  error({err = 'ERR ratelimit region numbers are not whole'})
end
local value = redis.pcall('GET', KEYS[1])
local count = 0
if type(value) == 'string' then
  count = tonumber(value)
  if not is_exact(count) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
elseif type(value) == 'table' then
  raise(value, 'GET')
end
local room = rest - count
if room < cost then
  return {0, math.max(room, 0), left, left}
end
local taken = math.min(room, most)
-- The first write gives the key its TTL; later ones keep it (a far server whose clock is
-- ahead never ends the home region's count of the window early).
if count == 0 then
  call('SET', KEYS[1], string.format('%d', count + taken), 'PX', ttl)
else
  call('SET', KEYS[1], string.format('%d', count + taken), 'KEEPTTL')
end
return {taken, room - taken, 0, left}
