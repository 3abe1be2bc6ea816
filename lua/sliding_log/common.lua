-- sliding_log/common.lua: the sliding log as take, peek, refund and the group script use
-- it (after lib.lua).
--
-- One sorted set per subject: a member per token granted, scored by the time (ms, on
-- Redis's clock) it was granted. A request is allowed when the members younger than
-- the window, plus its cost, are at most the capacity: exact for every window of that
-- length. Members of the window's past are removed when the log is written; the key
-- lives a window after its last write. Capacity is bounded (algorithm/sliding_log.h),
-- so a log holds at most that many members.
--
-- Each check takes 3 arguments: capacity, cost, window in ms.

local SLIDING_LOG = {nkeys = 1, nargs = 3, clock = true}

function SLIDING_LOG.load(k, a, now)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    window = tonumber(ARGV[a + 2]),
    now = now,
    added = 0,
  }
  local entries = call('ZRANGEBYSCORE', s.key, string.format('(%d', now - s.window), '+inf',
                       'WITHSCORES')
  s.times = {}
  for i = 2, #entries, 2 do
    local t = tonumber(entries[i])
    if not is_exact(t) then
      error({err = 'ERR ratelimit bucket state is corrupt'})
    end
    s.times[#s.times + 1] = t
  end
  return s
end

-- The time of the k-th oldest entry, counting the ones this call added (at now, after
-- any that a clock stepping back left in the future).
local function log_time(s, k)
  local past = 0
  while past < #s.times and s.times[past + 1] <= s.now do
    past = past + 1
  end
  if k <= past then
    return s.times[k]
  elseif k <= past + s.added then
    return s.now
  end
  return s.times[k - s.added]
end

function SLIDING_LOG.try(s, e)
  local held = #s.times + s.added
  if held + e.cost <= s.capacity then
    s.added = s.added + e.cost
    return true
  end
  -- Once the oldest entries that are in the way have left the window.
  e.retry = log_time(s, held + e.cost - s.capacity) + s.window - s.now
  return false
end

function SLIDING_LOG.undo(s, e)
  s.added = s.added - e.cost
end

-- A refund takes out the oldest entries in the window: whichever were the refunded
-- tokens, the log then never counts fewer in any window to come than it should.
function SLIDING_LOG.refund(s, e)
  s.removed = math.min(e.cost, #s.times)
end

function SLIDING_LOG.may(s)
  may_write('ZADD', s.key, 'NX', '0', 'm')
  may_write('ZREMRANGEBYSCORE', s.key, '-inf', '0')
  may_write('PEXPIRE', s.key, '1')
end

function SLIDING_LOG.ttl(s)
  return s.window
end

function SLIDING_LOG.write(s)
  call('ZREMRANGEBYSCORE', s.key, '-inf', string.format('%d', s.now - s.window))
  if s.removed then
    if s.removed > 0 then
      call('ZREMRANGEBYRANK', s.key, 0, s.removed - 1)
      for i = 1, s.removed do
        table.remove(s.times, 1)
      end
    end
    return
  end
  -- Members are unique: "<now>:<n>" with n past every member this ms could have.
  local n = #s.times
  local added = 0
  while added < s.added do
    local args = {}
    for i = 1, s.added - added do
      n = n + 1
      args[#args + 1] = string.format('%d', s.now)
      args[#args + 1] = string.format('%d:%d', s.now, n)
    end
    added = added + call('ZADD', s.key, 'NX', unpack(args))
  end
  call('PEXPIRE', s.key, s.window)
end

function SLIDING_LOG.answer(s)
  local held = #s.times + s.added
  local reset = 0
  if held > 0 then
    reset = log_time(s, held) + s.window - s.now
  end
  return math.max(s.capacity - held, 0), reset
end
