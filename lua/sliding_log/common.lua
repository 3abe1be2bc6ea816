-- sliding_log/common.lua: the sliding log as take, peek, refund and the group script use it
-- (after lib.lua and cells.lua). algorithm/sliding_log.c is the same in C.
--
-- Exact: at most `capacity` tokens granted in any window of `window` ms. One sorted set per
-- subject holds a member per granted request (not per token), scored by its time (ms on
-- Redis's clock). A member is "<P>/<c>" or "<P>/<c>/<F>": P the tokens the log granted up
-- to and including it (a prefix sum, written in 16 digits so that members of one ms sort by
-- it), c its cost, and F, read on the newest member only, the floor below which tokens were
-- refunded. A request is stamped max(now, the newest member's time): times and sums rise
-- together, and a clock that steps back never puts a request before another (it expires
-- later instead, never sooner). So the tokens in the window are the newest P less the start
-- of the first member in the window (its P - c) or F, whichever is higher; the member
-- holding the k-th oldest of those tokens (a denial's wait) is the first whose P reaches
-- it, a range of names (see log_names). Members that left the window, or lie under the
-- floor, go at most TRIM_MOST a write; a log that counts nothing any more is deleted as a
-- whole (so the sums start again at 0). The key lives a window after its last write
-- (after its newest member, if later). So every call is a few commands of O(log N), N
-- at most a few times the capacity (algorithm/sliding_log.h bounds it).
--
-- ratelimit 0.8.0 wrote a member "<ms>:<n>" per token. Such a log (its newest member says
-- so) is read as one request at its newest time holding every token it counts in the
-- window: never fewer, nor sooner gone, than it held. Its first write replaces it by that
-- one member (UNLINK), so the conversion too is O(log N).
--
-- Each check takes 3 arguments: capacity, cost, window in ms.

local SLIDING_LOG = {nkeys = 1, nargs = 3, clock = true}

-- The most members one write removes: bounded work, more than a take adds.
local TRIM_MOST = 4

-- A member's sum, cost and floor (0 without one); nil for 0.8.0's "<ms>:<n>".
local function log_member(member)
  local sum, cost, floor = string.match(member, '^(%d+)/(%d+)/?(%d*)$')
  if sum == nil then
    if string.match(member, '^%d+:%d+$') then
      return nil
    end
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  sum, cost, floor = tonumber(sum), tonumber(cost), tonumber(floor) or 0
  if not (is_exact(sum) and is_exact(cost) and is_exact(floor)) or cost < 1 or cost > sum
     or floor > sum then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return sum, cost, floor
end

-- A member's time.
local function log_time(score)
  local time = tonumber(score)
  if not is_exact(time) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return time
end

local function log_name(sum, cost, floor)
  if floor > 0 then
    return string.format('%016d/%d/%d', sum, cost, floor)
  end
  return string.format('%016d/%d', sum, cost)
end

function SLIDING_LOG.load(k, a, now)
  local s = {
    key = KEYS[k],
    capacity = tonumber(ARGV[a]),
    cost = tonumber(ARGV[a + 1]),
    window = tonumber(ARGV[a + 2]),
    now = now,
    added = 0,
    removed = 0,
    -- The tokens counted now are those numbered (base, top]: from the window's start (the
    -- sum before its first member) or the floor, whichever is higher, to the newest sum.
    top = 0,
    base = 0,
    start = 0,
  }
  s.past = string.format('%d', now - s.window)
  local newest = call('ZRANGE', s.key, -1, -1, 'WITHSCORES')
  if newest[1] then
    s.member = newest[1]
    s.last = log_time(newest[2])
    local sum, cost, floor = log_member(s.member)
    if sum == nil then
      -- 0.8.0's log: a member per token.
      s.old = true
      s.top = call('ZCOUNT', s.key, '(' .. s.past, '+inf')
      s.start = 0
    elseif s.last > now - s.window then
      if sum > EXACT_MAX - s.capacity then
        error({err = 'ERR ratelimit bucket state is corrupt'})
      end
      s.top, s.last_cost = sum, cost
      -- The oldest members: those out of the window go at the next write, and the first
      -- in it, if among them, starts the count (one command for both, most of the time).
      local oldest = call('ZRANGE', s.key, 0, TRIM_MOST - 1, 'WITHSCORES')
      local first
      s.expired = {}
      for i = 1, #oldest, 2 do
        if log_time(oldest[i + 1]) > now - s.window then
          first = oldest[i]
          break
        end
        s.expired[#s.expired + 1] = oldest[i]
      end
      if first == nil then
        first = call('ZRANGEBYSCORE', s.key, '(' .. s.past, '+inf', 'LIMIT', 0, 1)[1]
      end
      local first_sum, first_cost = log_member(first or '')
      if first_sum == nil or first_sum > sum then
        error({err = 'ERR ratelimit bucket state is corrupt'})
      end
      s.start = first_sum - first_cost
      s.base = math.max(s.start, floor)
    end
  end
  s.used = s.top - s.base
  -- New members go after every member the log counts (see above).
  s.stamp = now
  if s.used > 0 and s.last > now then
    s.stamp = s.last
  end
  return s
end

-- Name bounds of a range of members by sum: from sum on, and below sum.
local function from_sum(sum)
  return string.format('[%016d', sum)
end

local function below_sum(sum)
  return string.format('(%016d', sum)
end

-- The log's members named from..to (bounds as ZRANGE BYLEX takes them), at most count: a
-- log's names sort as its ranks do (sums rise with times, in 16 digits), so Redis finds a
-- range of names in O(log N), as in a set of equal scores. (ZRANGEBYLEX on a Redis before
-- 6.2, which has no BYLEX.)
local function log_names(s, from, to, count)
  local names = redis.pcall('ZRANGE', s.key, from, to, 'BYLEX', 'LIMIT', 0, count)
  if type(names) == 'table' and names.err then
    if is_refused(names.err) then
      raise(names, 'ZRANGE')
    end
    names = call('ZRANGEBYLEX', s.key, from, to, 'LIMIT', 0, count)
  end
  return names
end

-- The time of the k-th oldest token counted now, this call's own tokens last: the first
-- member whose sum reaches it holds it.
local function token_time(s, k)
  if k > s.used then
    return s.stamp
  elseif s.old then
    return s.last
  end
  local name = log_names(s, from_sum(s.base + k), '+', 1)[1]
  if name == nil or log_member(name) == nil then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return log_time(call('ZSCORE', s.key, name))
end

function SLIDING_LOG.try(s, e)
  local held = s.used + s.added
  if held + e.cost <= s.capacity then
    s.added = s.added + e.cost
    return true
  end
  -- Once the oldest tokens that are in the way have left the window.
  e.retry = token_time(s, held + e.cost - s.capacity) + s.window - s.now
  return false
end

function SLIDING_LOG.undo(s, e)
  s.added = s.added - e.cost
end

-- A refund takes out the oldest tokens in the window: whichever were the refunded ones,
-- the log then never counts fewer in any window to come than it should.
function SLIDING_LOG.refund(s, e)
  s.removed = math.min(e.cost, s.used)
end

-- Whether this write deletes the log (see SLIDING_LOG.write).
local function log_replaced(s)
  return s.member and (s.old or s.used == 0 or s.used + s.added == s.removed)
end

-- Asked again by write (a lone take's only check): what was checked is not asked twice.
function SLIDING_LOG.may(s)
  if not s.checked then
    may_write('ZADD', s.key, '0', 'm')
    may_write('ZREM', s.key, 'm')
    may_write('PEXPIRE', s.key, '1')
    s.checked = true
  end
  if log_replaced(s) and not s.delete_checked then
    may_write(delete_command(s.key), s.key)
    s.delete_checked = true
  end
end

function SLIDING_LOG.ttl(s)
  return s.window
end

-- Removes the oldest members that count nothing any more, at most TRIM_MOST of them: those
-- out of the window, and those under the floor (a refund's), which come before the others.
local function log_trim(s, floor)
  local gone = s.expired
  if floor > s.start then
    gone = log_names(s, '-', below_sum(floor + 1), TRIM_MOST)
  end
  if #gone > 0 then
    call('ZREM', s.key, unpack(gone))
  end
end

function SLIDING_LOG.write(s)
  -- Several writes follow: each is checked before the first.
  SLIDING_LOG.may(s)
  local floor = s.base + s.removed
  if log_replaced(s) then
    delete_keys(s.key)
  end
  if s.used + s.added == s.removed then
    -- Nothing counted: no log at all.
    return
  end
  local anew = s.old or s.used == 0
  local newest = s.last
  if anew then
    -- 0.8.0's log, or one whose members all count nothing: written anew, sums from 0.
    if s.used > 0 then
      call('ZADD', s.key, s.last, log_name(s.used, s.used, floor))
    end
    s.top, s.start = s.used, 0
  elseif s.added == 0 then
    -- A refund: the newest member carries the new floor (added first: under OOM only a
    -- first write is refused, and then nothing has changed).
    call('ZADD', s.key, s.last, log_name(s.top, s.last_cost, floor))
    call('ZREM', s.key, s.member)
  end
  if s.added > 0 then
    local carried = floor
    if carried <= s.start then
      carried = 0
    end
    call('ZADD', s.key, s.stamp, log_name(s.top + s.added, s.added, carried))
    newest = s.stamp
  end
  if not anew then
    log_trim(s, floor)
  end
  call('PEXPIRE', s.key, math.max(s.window, newest + s.window - s.now))
end

function SLIDING_LOG.answer(s)
  local held = s.used + s.added - s.removed
  local reset = 0
  if held > 0 then
    local newest = s.last
    if s.added > 0 then
      newest = s.stamp
    end
    reset = newest + s.window - s.now
  end
  return math.max(s.capacity - held, 0), reset
end
