-- gcra/refund.lua: gives tokens back: the arrival time moves back by their emission
-- intervals, never before now (rl_refund, a rolled-back rl_reserve).
-- KEYS[1] the arrival time; KEYS[2] optional: the mark that makes this refund happen once.
-- ARGV as take_one.lua's, the cost being the amount. Replies {1 when given back (0: done
-- already), remaining, 0, reset_after_ms}.
return refund_one(GCRA)
