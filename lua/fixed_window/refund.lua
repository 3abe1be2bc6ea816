-- fixed_window/refund.lua: gives tokens back to the window they were taken in (its key:
-- PostgreSQL names the take's window), never below 0 (rl_refund, a rolled-back
-- rl_reserve). A window that is over has nothing to give back.
-- KEYS[1] the window's count; KEYS[2] optional: the mark that makes this refund happen
-- once. ARGV as take_one.lua's, the cost being the amount. Replies {1 when given back
-- (0: done already), remaining, 0, reset_after_ms}.
-- A ROLLOVER check (common.lua) when its numbers say so.
return refund_one(fixed_cell(0))
