-- region/deposit_one.lua: what a lease from the home region brought (region/lease_one.lua)
-- beyond the take it was asked for, kept in the region's Redis for the rest of the window
-- (composed after lib.lua only). The key's TTL is the window's time left as measured
-- after the lease came back, so the tokens are never granted after their window.
-- KEYS[1]  this window's lease key, "<tokens left> <tokens leased>"
-- ARGV     "now" (unused), tokens to keep, tokens leased in all by this lease, TTL in ms
--          (at least 1)
-- Replies {tokens left}.
if #ARGV ~= 4 then
  return expect_args(4)
end
local add = tonumber(ARGV[2])
local leased = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
if not (is_exact(add) and is_exact(leased) and is_exact(ttl)) or ttl < 1 then
  error({err = 'ERR ratelimit region numbers are not whole'})
end
local held, before = 0, 0
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'string' then
  local a, b = string.match(value, '^(%d+) (%d+)$')
  if a then
    held, before = tonumber(a), tonumber(b)
  end
end
call('SET', KEYS[1], string.format('%d %d', held + add, before + leased), 'PX', ttl)
return {held + add}
