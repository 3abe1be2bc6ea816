-- once.lua: a decision made once per request id (rl_consume's request_id). The build
-- (dev/lua-script, RL_LUA_ONCE=1) puts it after the script it wraps, whose body becomes
-- the function decide().
-- KEYS     the script's keys, then the request's (under the subject's key: the same slot)
-- ARGV     the script's numbers, then how long a grant is remembered, in ms
-- Replies  the script's numbers (at least once_numbers: one check's 4 and a booking's wait,
--          0 when it has none; once_wait false: a 5th number that is no wait, a rollover
--          window's limit), then 1 when they are a replay, else 0.
-- A grant is remembered with its answer, and the same request again gets that answer and
-- takes nothing. A denial is not remembered: it took nothing, so asking again charges
-- nothing twice (and is not held to a denial until the memory expires).
-- A booking's wait (one check: its 5th number) is remembered as the time it ends, so that a
-- replay waits until then too. A replay marks the memory (" replayed"): the grant is in use
-- twice, and a give-back of it (cells.lua's refund_one) then gives nothing back.
local request = KEYS[#KEYS]
KEYS[#KEYS] = nil
local remember = tonumber(ARGV[#ARGV])
ARGV[#ARGV] = nil
if not is_exact(remember) or remember < 1 then
  error({err = 'ERR ratelimit request memory is not a whole number of ms'})
end
local stored = redis.pcall('GET', request)
if type(stored) == 'table' then
  raise(stored, 'GET')
end

-- The numbers of reply as a stored string: whole numbers, never in exponent notation.
local function numbers_text(reply)
  local parts = {}
  for i = 1, #reply do
    parts[i] = string.format('%d', reply[i])
  end
  return table.concat(parts, ' ')
end

if stored then
  local reply = {}
  for number in string.gmatch(stored, '%d+') do
    reply[#reply + 1] = tonumber(number)
  end
  if once_wait and (reply[5] or 0) > 0 then
    reply[5] = math.max(reply[5] - now_ms(ARGV[1]), 0)
  end
  if not string.find(stored, 'replayed', 1, true) then
    may_write('SET', request, '1', 'KEEPTTL')
    call('SET', request, stored .. ' replayed', 'KEEPTTL')
  end
  reply[#reply + 1] = 1
  return reply
end
may_write('SET', request, '1', 'PX', 1)
local reply = decide()
while #reply < once_numbers do
  reply[#reply + 1] = 0
end
if reply[1] ~= 0 then
  local memory = {}
  for i = 1, #reply do
    memory[i] = reply[i]
  end
  if once_wait and reply[5] > 0 then
    memory[5] = now_ms(ARGV[1]) + reply[5]
  end
  call('SET', request, numbers_text(memory), 'PX', remember)
end
reply[#reply + 1] = 0
return reply
