-- sliding_log/refund.lua: gives tokens back: takes out as many of the log's oldest
-- entries in the window (rl_refund, a rolled-back rl_reserve). KEYS[2] optional: the mark that makes
-- this refund happen once. ARGV as take.lua's, the cost being the amount. Replies {1 when
-- given back (0: done already), remaining, 0, reset_after_ms}.
return refund_one(SLIDING_LOG)
