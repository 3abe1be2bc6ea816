-- cells.lua: what the scripts that drive an algorithm's cell share (its common.lua
-- defines the cell): its peek and refund, the group script. The build (dev/lua-script)
-- puts it after lib.lua; a lean take_one.lua, which inlines its algorithm, gets lib.lua
-- alone, since each function defined here is work for every call of a script.

-- a + b, saturating at EXACT_MAX (only absurd pauses of centuries reach it).
local function add(a, b)
  local sum = a + b
  if sum > EXACT_MAX then
    return EXACT_MAX
  end
  return sum
end

-- The clock the state sees, checked: a whole number of ms.
local function checked_clock(arg)
  local now = now_ms(arg)
  if not is_exact(now) then
    error({err = 'ERR ratelimit clock is not a whole number of ms'})
  end
  return now
end

-- A stored count (a window's), checked: a missing key is 0.
local function stored_count(value)
  if not value then
    return 0
  end
  local count = tonumber(value)
  if not is_exact(count) then
    error({err = 'ERR ratelimit bucket state is corrupt'})
  end
  return count
end

-- Writes a window's count with its TTL in one command; a count of 0 is no state at all.
local function write_count(key, count, ttl)
  if count > 0 then
    call('SET', key, string.format('%d', count), 'PX', ttl)
  else
    call('DEL', key)
  end
end

-- Before the first write: that write_count (or an integer state's write) may run.
local function may_write_count(key)
  may_write('SET', key, '0', 'PX', 1)
  may_write('DEL', key)
end

-- The reply of one check of a cell algorithm (see group.lua): {allowed, remaining,
-- retry_after_ms, reset_after_ms}.
local function answer_of(X, s, e, allowed)
  local remaining, reset = X.answer(s)
  local retry = 0
  if allowed == 0 and e.granted == false then
    retry = e.retry
  end
  return {allowed, remaining, retry, reset}
end

-- Runs the mark of a refund done once (KEYS[mark]): true when this refund may credit.
-- The mark only has to outlive a retry of this refund: a minute at most.
local function refund_once(mark, ttl)
  if mark == nil then
    return true
  end
  return call('SET', mark, '1', 'NX', 'PX', math.max(1, math.min(ttl, 60000)))
end

-- The state of the one check of cell algorithm X (its common.lua) a script makes: KEYS its
-- keys, ARGV the clock, its numbers, then `extra` more (raises unless there are that many).
local function load_one(X, extra)
  expect_args(1 + X.nargs + extra)
  local now = X.clock and checked_clock(ARGV[1]) or nil
  return X.load(1, 2, now)
end

-- One check of cell algorithm X (its common.lua): KEYS its keys, ARGV the clock then its
-- numbers (or s, their state loaded already). A take (rl_consume) writes what it granted;
-- a peek (rl_peek) is the decision a take would make, nothing written.
local function decide_one(X, take, s)
  s = s or load_one(X, 0)
  local allowed = 0
  if X.try(s, s) then
    allowed = 1
    if take then
      X.write(s)
    else
      X.undo(s, s)
    end
  else
    s.granted = false
  end
  return answer_of(X, s, s, allowed)
end

-- rl_refund of one check of cell algorithm X: gives its cost back, never beyond what
-- an untouched state holds. KEYS its keys, then optionally a mark that makes the refund
-- happen once, then optionally the request id of the take it gives back (once.lua), forgotten
-- with it, so that the request asked again is charged again; answers {1 when given back (0
-- when the mark showed it was done already), remaining, 0, reset_after_ms}.
local function refund_one(X)
  local s = load_one(X, 0)
  local mark = KEYS[X.nkeys + 1]
  local request = KEYS[X.nkeys + 2]
  local done = 0
  if request ~= nil then
    -- A grant a replay uses too (once.lua marks it): nothing goes back, the id stays.
    local memory = redis.pcall('GET', request)
    if type(memory) == 'string' and string.find(memory, 'replayed', 1, true) then
      s.granted = true
      return answer_of(X, s, s, 0)
    end
  end
  if mark ~= nil then
    may_write('SET', mark, '1', 'NX', 'PX', 1)
    X.may(s)
  end
  if request ~= nil then
    may_write(delete_command(request), request)
  end
  if refund_once(mark, X.ttl(s)) then
    X.refund(s, s)
    X.write(s)
    done = 1
  end
  if request ~= nil then
    delete_keys(request)
  end
  s.granted = true
  return answer_of(X, s, s, done)
end

-- A slice of a hot subject's tokens for this server's allowance (engine/allowance.c): the
-- check's cost and as many more as the state holds now, at most ARGV[#ARGV] tokens in
-- all, taken in one write. KEYS and ARGV as the algorithm's take, then that most (at
-- least the cost). Answers {tokens taken (0: denied, nothing taken), remaining after,
-- retry_after_ms (for the cost), reset_after_ms}. The tokens held are what the answer
-- of the state says remain, exactly what a take of them would grant.
local function slice_one(X)
  local s = load_one(X, 1)
  local unit = s.unit or 1
  local most = tonumber(ARGV[2 + X.nargs])
  if not is_exact(most) or most * unit < s.cost then
    error({err = 'ERR ratelimit slice smaller than its cost'})
  end
  local held = X.answer(s)
  if held * unit < s.cost then
    X.try(s, s)
    s.granted = false
    return answer_of(X, s, s, 0)
  end
  local taken = math.min(held, most)
  s.cost = taken * unit
  X.try(s, s)
  X.write(s)
  s.granted = true
  local remaining, reset = X.answer(s)
  return {taken, remaining, 0, reset}
end

-- A take that may wait (rl_consume's max_wait): granted now when the cost fits; else the
-- earliest time it will fit is booked (the cost is taken from refill still to come, so
-- later callers queue behind it) when that time is at most max_wait ms away and the state
-- then owes at most max_debt tokens past empty; else denied as a take is, nothing written.
-- A cell that books has X.room(s, most): the units it may take owing at most `most`
-- units past empty; and X.owe(s, e): takes e's cost (within room), answering the ms until
-- its tokens are there.
-- KEYS and ARGV as the algorithm's take, then max_wait in ms and max_debt in tokens.
-- Answers {allowed, remaining, retry_after_ms, reset_after_ms, wait_ms}.
local function book_one(X)
  local s = load_one(X, 2)
  local max_wait = tonumber(ARGV[2 + X.nargs])
  local most = tonumber(ARGV[3 + X.nargs])
  if not is_exact(max_wait) or not is_exact(most) then
    error({err = 'ERR ratelimit wait or debt is not a whole number'})
  end
  X.may(s)
  local allowed, wait = 0, 0
  if X.try(s, s) then
    allowed = 1
  elseif s.retry <= max_wait and X.room(s, most * (s.unit or 1)) >= s.cost then
    allowed = 1
    wait = X.owe(s, s)
  end
  if allowed == 1 then
    X.write(s)
  else
    s.granted = false
  end
  local reply = answer_of(X, s, s, allowed)
  reply[5] = wait
  return reply
end

-- Settles a take up (rl_settle): takes the cost even beyond what the state holds, owing at
-- most max_debt tokens past empty; of a cost that would owe more, what stays within.
-- KEYS and ARGV as the algorithm's take, then max_debt in tokens.
-- Answers {tokens taken, remaining, ms until it owes nothing, reset_after_ms}.
local function owe_one(X)
  local s = load_one(X, 1)
  local unit = s.unit or 1
  local most = tonumber(ARGV[2 + X.nargs])
  if not is_exact(most) then
    error({err = 'ERR ratelimit debt is not a whole number'})
  end
  X.may(s)
  s.cost = math.min(s.cost, math.max(floor_div(math.max(X.room(s, most * unit), 0), unit), 0) * unit)
  local wait = 0
  if s.cost > 0 then
    wait = X.owe(s, s)
    X.write(s)
  end
  local remaining, reset = X.answer(s)
  return {floor_div(s.cost, unit), remaining, wait, reset}
end
