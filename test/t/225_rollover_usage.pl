
# Quotas that roll over and the usage of a subject (0.12.0), against a real Redis, on the
# injected clock (ratelimit.test_clock_ms):
# - rollover: at a window's start, what the previous window left unused, at most rollover,
#   is added to its limit, exactly: across month ends (28 and 31 days), DST days (23 and 25
#   hours) and a year; a reservation taken at a window's last moment and rolled back after
#   it gives nothing back to a window that is over; 64 racing sessions get exactly the
#   capacity and what was carried; rl_headers tells the real limit; overrides, rl_define,
#   the constraints and the version know it; a wait is refused.
# - rl_usage: used, limit, fraction and reset for every algorithm, for one subject or many
#   in one call; NULL numbers when Redis cannot answer; not PUBLIC's.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

use RateLimitTest;

my $clients = 64;
my $redis = redis_start(name => 'rollover');
my $node = rl_node('rollover', redis => $redis, max_connections => $clients + 20);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period, time_zone, rollover) VALUES
	  ('monthly', 'fixed_window', 1000, '1 mon', 'Europe/Berlin', 300),
	  ('daily', 'fixed_window', 10, '1 day', 'America/New_York', 5),
	  ('yearly', 'fixed_window', 100, '1 year', 'UTC', 50),
	  ('race', 'fixed_window', 100, '1 day', 'UTC', 100);
	INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period) VALUES
	  ('u_tb', 'token_bucket', 10, 10, '10 seconds'),
	  ('u_gcra', 'gcra', 10, 10, '10 seconds');
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES
	  ('u_fw', 'fixed_window', 10, '10 seconds'),
	  ('u_sw', 'sliding_window', 10, '10 seconds'),
	  ('u_sl', 'sliding_log', 10, '10 seconds');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('u_cc', 'concurrency', 3, '1 hour');
	-- A take at a time given in words: allowed|remaining|capacity (the limit it counted against).
	CREATE FUNCTION take_at(at timestamptz, p text, s text, c bigint) RETURNS text
	LANGUAGE sql AS $$
	  SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM at) * 1000)::bigint::text, false);
	  SELECT format('%s|%s|%s', allowed, remaining, capacity) FROM rl_consume(p, s, c);
	$$;
	CREATE FUNCTION usage_at(at timestamptz, p text, s text) RETURNS text
	LANGUAGE sql AS $$
	  SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM at) * 1000)::bigint::text, false);
	  SELECT format('%s|%s|%s|%s', used, "limit", round(fraction::numeric, 3),
	                (extract(epoch FROM reset - at) * 1000)::bigint)
	  FROM rl_usage(p, s);
	$$;
	CREATE TABLE grants (allowed boolean);
});

# The last line of what a statement printed (a set_config before it prints its value).
sub sql { return (split /\n/, $node->safe_psql('postgres', $_[0]))[-1] // '' }
sub take { my ($at, $p, $s, $c) = @_; return sql("SELECT take_at('$at', '$p', '$s', $c)") }
sub usage { my ($at, $p, $s) = @_; return sql("SELECT usage_at('$at', '$p', '$s')") }

#
# 1. Month ends in Europe/Berlin: a month of 31 days, one of 28, carried exactly.
#
is(take('2027-01-15 12:00 Europe/Berlin', 'monthly', 't', 1000), 't|300|1300',
	'January: a subject new to the policy left December unused: 1000 + 300 carried');
is(take('2027-01-31 23:59:59.999 Europe/Berlin', 'monthly', 't', 300), 't|0|1300',
	'the last millisecond of January (31 days) still counts in January');
is(take('2027-01-31 23:59:59.999 Europe/Berlin', 'monthly', 't', 1), 'f|0|1300', 'and January is spent');
is(take('2027-02-01 00:00 Europe/Berlin', 'monthly', 't', 800), 't|200|1000',
	'February: January used all it had, nothing carried');
is(usage('2027-02-20 00:00 Europe/Berlin', 'monthly', 't'), '800|1000|0.800|' . 9 * 86_400_000,
	'rl_usage in February: 800 of 1000 used, full again at its end (28 days)');
# A reservation at February's last moment, rolled back in March: February is over.
sql(q{BEGIN;
	SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM timestamptz '2027-02-28 23:59:59.990 Europe/Berlin') * 1000)::bigint::text, false);
	SELECT allowed FROM rl_reserve('monthly', 't', 100);
	SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM timestamptz '2027-03-01 00:00:01 Europe/Berlin') * 1000)::bigint::text, false);
	ROLLBACK;});
is(usage('2027-03-01 00:00:02 Europe/Berlin', 'monthly', 't'), '0|1100|0.000|0',
	'a reservation at the end of February rolled back in March: February had used 900, 100 carried');
is(take('2027-03-01 00:00:02 Europe/Berlin', 'monthly', 't', 1100), 't|0|1100', 'March grants 1100');
is(take('2027-03-31 23:59 Europe/Berlin', 'monthly', 't', 1), 'f|0|1100', 'and not one more');
is(take('2027-04-01 00:00 Europe/Berlin', 'monthly', 't', 1), 't|999|1000', 'April: nothing left to carry');
is(take('2027-06-10 00:00 Europe/Berlin', 'monthly', 't', 1), 't|1299|1300',
	'June after an unused May: the whole rollover (300), never more');
# rl_headers tells the window's real limit.
like(sql(q{SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM timestamptz '2027-06-10 01:00 Europe/Berlin') * 1000)::bigint::text, false);
	SELECT rl_headers(rl_consume('monthly', 't', 1))}), qr/q=1300;/, 'rl_headers names the limit 1300 (RateLimit-Policy: q=1300)');

#
# 2. DST days in America/New_York: 23 hours (2027-03-14) and 25 hours (2027-11-07).
#
is(take('2027-03-13 12:00 America/New_York', 'daily', 'd', 4), 't|11|15', 'March 13: 10 + 5 carried, 4 used');
is(take('2027-03-14 00:00 America/New_York', 'daily', 'd', 15), 't|0|15',
	'March 14 (23 hours): 11 were left unused, at most 5 carried');
is(take('2027-03-14 23:59:59 America/New_York', 'daily', 'd', 1), 'f|0|15',
	'its last second is still March 14 (22 h 59 min after its start)');
is(take('2027-03-15 00:00 America/New_York', 'daily', 'd', 1), 't|9|10', 'March 15: nothing carried');
is(take('2027-11-06 09:00 America/New_York', 'daily', 'd', 7), 't|8|15', 'November 6: 7 of 15 used');
is(take('2027-11-07 00:30 America/New_York', 'daily', 'd', 10), 't|5|15',
	'November 7 (25 hours): 8 left unused, 5 carried');
is(take('2027-11-07 06:30 UTC', 'daily', 'd', 5), 't|0|15', 'the second 01:30 (EST) is the same day');
is(take('2027-11-08 04:59:59 UTC', 'daily', 'd', 1), 'f|0|15', 'and so is 23:59:59 EST, 25 hours after it began');
is(take('2027-11-08 05:00 UTC', 'daily', 'd', 1), 't|9|10', 'November 8 begins at midnight EST');

#
# 3. A year, across its end.
#
is(take('2027-12-31 23:59:59 UTC', 'yearly', 'y', 30), 't|120|150', '2027: 100 + 50 carried, 30 used');
is(take('2028-01-01 00:00 UTC', 'yearly', 'y', 140), 't|10|150', '2028: 120 left unused, 50 carried');
is(take('2029-01-01 00:00 UTC', 'yearly', 'y', 1), 't|109|110', '2029: 10 left unused, 10 carried');

#
# 4. 64 racing sessions on one window: exactly the capacity and what was carried.
#
is(take('2027-05-01 12:00 UTC', 'race', 'r', 150), 't|50|200', 'the day before: 150 of 200 used');
my $dir = PostgreSQL::Test::Utils::tempdir();
append_to_file("$dir/race.sql", q{SET ratelimit.test_clock_ms = '1809259200000';
INSERT INTO grants SELECT allowed FROM rl_consume('race', 'r', 1) WHERE source = 'redis';
});
is(sql("SELECT (extract(epoch FROM timestamptz '2027-05-02 12:00 UTC') * 1000)::bigint"), '1809259200000',
	'the racing sessions decide on May 2');
run_pgbench($node, 'race', "$dir/race.sql", $clients, 5);
is(sql("SELECT count(*) FILTER (WHERE allowed) || '/' || count(*) FROM grants"), '150/320',
	'64 sessions, 320 takes: exactly 150 granted (100 + the 50 carried)');
is(usage('2027-05-02 12:00 UTC', 'race', 'r'), '150|150|1.000|43200000', 'rl_usage: all 150 used');
my @keys = grep { /:r/ } split /\n/, $redis->cli('--scan', '--pattern', '*');
my @values = map { $redis->cli('GET', $_) } @keys;
ok((grep { $_ eq '150:50' } @values), 'the window holds its count and what it carried: 150:50');
is(sql(q{SELECT set_config('ratelimit.test_clock_ms', '1809259200000', false);
	SELECT remaining || '/' || capacity FROM rl_refund('race', 'r', 1000)}), '150/100',
	'a refund of 1000 gives back what was used, never more (150 left of the limit 150)');

#
# 5. What else knows rollover: overrides, rl_define, the constraints, the version, waits.
#
sql("INSERT INTO rl_override (policy, subject, capacity) VALUES ('monthly', 'small', 50)");
is(take('2027-01-15 00:00 Europe/Berlin', 'monthly', 'small', 100), 't|0|100',
	'an override of capacity 50 carries at most 50');
is(sql("SELECT rollover FROM rl_define('def', 100, per => '1 day', algorithm => 'fixed_window', rollover => 20)"),
	'20', 'rl_define takes rollover');
is(sql("SELECT rollover FROM rl_define('def', 100, per => '1 day', algorithm => 'fixed_window')"), '20',
	'and keeps it when not given');
my $v1 = sql("SELECT version FROM rl_policy WHERE name = 'def'");
sql("UPDATE rl_policy SET rollover = 30 WHERE name = 'def'");
isnt(sql("SELECT version FROM rl_policy WHERE name = 'def'"), $v1, 'a change of rollover is a new version');
my ($rc, $out, $err) = $node->psql('postgres', "UPDATE rl_policy SET rollover = 101 WHERE name = 'def'");
like($err, qr/rl_policy_rollover_check/, 'rollover above the capacity is refused');
($rc, $out, $err) = $node->psql('postgres', "UPDATE rl_policy SET rollover = 1 WHERE name = 'u_tb'");
like($err, qr/rl_policy_rollover_check/, 'so is rollover on a token bucket');
($rc, $out, $err) = $node->psql('postgres', "SELECT rl_consume('monthly', 'w', 1, max_wait => '1 second')");
like($err, qr/cannot book a wait/, 'a wait on a policy with rollover is refused');
($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT rl_consume('monthly', 'w', 1, max_wait => '1 second')");
like($err, qr/0A000/, 'with 0A000');

#
# 6. rl_usage for every algorithm, on the injected clock (2027-07-01 00:00:02 UTC, 2 s
#    into a 10-second window).
#
my $t = '2027-07-01 00:00:02 UTC';
take($t, $_, 'u', 4) foreach qw(u_tb u_gcra u_fw u_sw u_sl);
is(usage($t, 'u_tb', 'u'), '4|10|0.400|4000', 'token_bucket: 4 used, full again in 4 s');
is(usage($t, 'u_gcra', 'u'), '4|10|0.400|4000', 'gcra: the same');
is(usage($t, 'u_fw', 'u'), '4|10|0.400|8000', 'fixed_window: 4 used, the window ends in 8 s');
like(usage($t, 'u_sw', 'u'), qr/^4\|10\|0\.400\|\d+$/, 'sliding_window: 4 used');
is(usage($t, 'u_sl', 'u'), '4|10|0.400|10000', 'sliding_log: 4 used, the last out in 10 s');
is(usage($t, 'u_tb', 'nobody'), '0|10|0.000|0', 'a subject never seen has used nothing');
my $holder = RateLimitTest::session($node);
$holder->query_ok("SELECT allowed FROM rl_acquire('u_cc', 'u', scope => 'session')");
$holder->query_ok("SELECT allowed FROM rl_acquire('u_cc', 'u', scope => 'session')");
like(sql("SELECT used || '|' || \"limit\" FROM rl_usage('u_cc', 'u')"), qr/^2\|3$/, 'concurrency: 2 of 3 leases held');
is(sql("SELECT string_agg(subject || '=' || used || '/' || \"limit\", ' ' ORDER BY ord)
	FROM rl_usage('u_cc', ARRAY['u', 'v', 'u']) WITH ORDINALITY AS r(subject, used, \"limit\", fraction, reset, source, ord)"),
	'u=2/3 v=0/3 u=2/3', 'many concurrency subjects in one call, in input order');
is(sql(qq{SELECT set_config('ratelimit.test_clock_ms', (extract(epoch FROM timestamptz '$t') * 1000)::bigint::text, false);
	SELECT string_agg(subject || '=' || used, ' ' ORDER BY ord)
	FROM rl_usage('u_tb', ARRAY['u', 'nobody', 'u']) WITH ORDINALITY AS r(subject, used, "limit", fraction, reset, source, ord)}),
	'u=4 nobody=0 u=4', 'many token-bucket subjects in one call, in input order');
is(sql("SELECT count(*) FROM rl_usage('u_tb', ARRAY[]::text[])"), '0', 'an empty array reads nothing');
($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT * FROM rl_usage('u_tb', ARRAY['a', NULL])");
like($err, qr/22004/, 'a NULL subject is refused with 22004');
($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT * FROM rl_usage('nope', 'a')");
like($err, qr/42704/, 'an unknown policy with 42704');
sql("CREATE ROLE plain LOGIN");
($rc, $out, $err) = $node->psql('postgres', "SET ROLE plain; SELECT * FROM rl_usage('u_tb', 'u')");
like($err, qr/permission denied/, 'a role without the grant cannot read usage');

# Many subjects in one round trip: 200 subjects through a proxy 100 ms away (a round trip)
# are read in well under 2 s (one after another they would take 20 s).
my $proxy = delay_proxy_start(target_port => $redis->port, delay_ms => 50);
my $far = RateLimitTest::session($node,
	options => '-c ratelimit.command_timeout=10s -c ratelimit.redis_url=' . $proxy->url);
$far->query_ok("SELECT count(*) FROM rl_usage('u_tb', 'warm')");    # connected
my ($seconds, $rows) = timed(sub {
	$far->query_ok("SELECT count(*) FILTER (WHERE source = 'redis') FROM rl_usage('u_tb', ARRAY(SELECT 'far' || g FROM generate_series(1, 200) g))");
});
is($rows, 200, 'rl_usage of 200 subjects 100 ms away: all read from Redis');
cmp_ok($seconds, '<', 2, sprintf('in one round trip, not 200 (%.2f s)', $seconds));
$far->quit;
$proxy->stop;

#
# 7. Redis silent: no numbers, and who answered.
#
$redis->stop;
is(sql("SELECT coalesce(used::text, 'null') || '|' || source FROM rl_usage('u_tb', 'u')"), 'null|fail_closed',
	'Redis down: the numbers are NULL, the source says why');

$holder->quit;
done_testing();
