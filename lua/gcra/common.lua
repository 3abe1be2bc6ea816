-- gcra/common.lua: GCRA as peek, refund and the group script use it (after lib.lua;
-- take_one.lua, rl_consume's take, inlines it). algorithm/gcra.c is the same in C.
--
-- Time is counted in units of 1/rate ms; each token is an emission interval of `unit`
-- units; the burst tolerance is capacity * unit units. The one number stored is the
-- theoretical arrival time (TAT) in those units, an integer string written with
-- SET ... PX until that time, when it would mean nothing any more. A missing key is a
-- TAT of now. A cost is allowed when max(TAT, now) + cost * unit - now is at most the
-- tolerance; remaining tokens are floor((tolerance - (TAT - now)) / unit).
--
-- Each check takes 5 arguments, as the token bucket's: tolerance (capacity units), rate
-- (units per ms), unit (units per token), cost in tokens, TTL in ms (0: until the TAT).
-- algorithm/gcra.c bounds the rate so that now * rate + tolerance stays below 2^53; a
-- TAT is at most that (when granted), so sums with a cost are made from TAT - now (up to
-- a cost of the whole tolerance, near 2^52, at the bound).

local GCRA = {nkeys = 1, nargs = 5, clock = true}

function GCRA.load(k, a, now)
  local s = {
    key = KEYS[k],
    tolerance = tonumber(ARGV[a]),
    rate = tonumber(ARGV[a + 1]),
    unit = tonumber(ARGV[a + 2]),
    ttl = tonumber(ARGV[a + 4]),
  }
  s.cost = tonumber(ARGV[a + 3]) * s.unit
  if now * s.rate > EXACT_MAX - s.tolerance then
    error({err = 'ERR ratelimit clock is beyond what gcra holds exactly'})
  end
  s.now = now * s.rate
  s.tat = s.now
  local value = redis.pcall('GET', s.key)
  if type(value) == 'table' then
    raise(value, 'GET')
  end
  if value then
    local tat = tonumber(value)
    if not is_exact(tat) then
      error({err = 'ERR ratelimit bucket state is corrupt'})
    end
    if tat > s.tat then
      s.tat = tat
    end
  end
  return s
end

function GCRA.try(s, e)
  if s.tat - s.now + e.cost <= s.tolerance then
    s.tat = s.tat + e.cost
    return true
  end
  e.retry = ceil_div(s.tat - s.now + e.cost - s.tolerance, s.rate)
  return false
end

function GCRA.undo(s, e)
  s.tat = s.tat - e.cost
end

function GCRA.refund(s, e)
  s.tat = math.max(s.tat - e.cost, s.now)
end

-- The units a take may have owing at most `most` past the tolerance (see book_one in
-- cells.lua); the TAT stays below 2^53.
function GCRA.room(s, most)
  return s.tolerance + math.min(most, EXACT_MAX - s.now - s.tolerance) - (s.tat - s.now)
end

function GCRA.owe(s, e)
  s.tat = s.tat + e.cost
  local ahead = s.tat - s.now - s.tolerance
  if ahead <= 0 then
    return 0
  end
  return ceil_div(ahead, s.rate)
end

function GCRA.may(s)
  may_write_count(s.key)
end

-- Until the TAT (or the policy's idle_ttl, if longer); a TAT at now is no state at all.
function GCRA.ttl(s)
  return math.max(ceil_div(s.tat - s.now, s.rate), s.ttl, 1)
end

function GCRA.write(s)
  if s.tat > s.now then
    call('SET', s.key, string.format('%d', s.tat), 'PX', GCRA.ttl(s))
  else
    call('DEL', s.key)
  end
end

function GCRA.answer(s)
  local ahead = s.tat - s.now
  local remaining = 0
  if ahead < s.tolerance then
    remaining = floor_div(s.tolerance - ahead, s.unit)
  end
  return remaining, ceil_div(ahead, s.rate)
end
