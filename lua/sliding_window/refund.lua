-- sliding_window/refund.lua: gives tokens back to the window they were taken in
-- (KEYS[1]: PostgreSQL names the take's window), never below 0 (rl_refund, a rolled-back
-- rl_reserve). KEYS[3] optional: the mark that makes this refund happen once.
-- ARGV as take.lua's, the cost being the amount. Replies {1 when given back (0: done
-- already), remaining, 0, reset_after_ms}.
return refund_one(SLIDING_WINDOW)
