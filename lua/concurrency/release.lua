-- concurrency/release.lua: gives one lease back (rl_release, and the end of its
-- transaction or session); allowed says a lease still live was released.
may_write('ZREM', key, id)
local released = 0
local score = call('ZSCORE', key, id)
if score and tonumber(score) > now then
  released = 1
end
if score then
  call('ZREM', key, id)
end
trim_expired()
return lease_reply(released, held - released, false)
