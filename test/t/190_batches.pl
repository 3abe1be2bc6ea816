#!/usr/bin/perl
#
# Batches: rl_consume_many decides many subjects of one policy in one round trip per
# Redis node, with the answers single calls would give; bad elements are refused before
# anything is charged. The statement-level rl_limit_trigger charges every subject of a
# statement in one round trip, and a rollback gives them back in one more. The Redis is
# 100 ms away (a proxy that delays every byte 50 ms each way), so round trips show in
# the time a call takes: 1,000 subjects one after another would take 100 s.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'batches');
my $node = rl_node('batches', redis => $redis);
my $proxy = delay_proxy_start(target_port => $redis->port, delay_ms => 50);
my $far = session($node,
	options => '-c ratelimit.command_timeout=5s -c ratelimit.redis_url=' . $proxy->url);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('b.many', 5, 1, '1 day', 'closed'),
	  ('b.twin', 5, 1, '1 day', 'closed'),
	  ('b.rows', 3, 1, '1 day', 'closed'),
	  ('b.open', 3, 1, '1 day', 'open');
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period, fail_mode) VALUES
	  ('b.window', 'fixed_window', 4, '1000 days', 'closed'),
	  ('b.window_twin', 'fixed_window', 4, '1000 days', 'closed');
	CREATE TABLE b_rows (tenant text);
	CREATE TRIGGER b_rows_limit AFTER INSERT ON b_rows REFERENCING NEW TABLE AS new_rows
	    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('b.rows', 'tenant');
});

# 1,000 checks over 300 subjects (each named several times), costs 1 to 3, the same on
# both sides: the batch through the proxy, then single calls on the twin policy, on the
# same test clock (so that retry and reset times compare too).
my $clock = 2_400_000_000_000;
srand(15);
my (@subjects, @costs);
for (1 .. 1000)
{
	push @subjects, 'tenant_' . int(rand(300));
	push @costs, 1 + int(rand(3));
}
my $subjects_sql = 'ARRAY[' . join(',', map { "'$_'" } @subjects) . ']';
my $costs_sql = 'ARRAY[' . join(',', @costs) . ']::bigint[]';
$far->query_ok("SET ratelimit.test_clock_ms = '$clock'");

for my $case ([ 'b.many', 'b.twin', 'token bucket' ], [ 'b.window', 'b.window_twin', 'fixed window' ])
{
	my ($policy, $twin, $what) = @$case;
	my $calls_before = $redis->command_calls('evalsha') + $redis->command_calls('eval');
	my ($secs, $batch) = timed(sub {
		$far->query_ok("SELECT subject, allowed, remaining, retry_after_ms, reset_after_ms, source "
			  . "FROM rl_consume_many('$policy', $subjects_sql, $costs_sql)", 60);
	});
	my $calls = $redis->command_calls('evalsha') + $redis->command_calls('eval') - $calls_before;
	note sprintf('%s: rl_consume_many of 1,000 subjects through a 100 ms round trip: %.3f s', $what, $secs);
	cmp_ok($secs, '<', 0.6, "$what: 1,000 decisions within a few round trips (< 0.6 s; one by one: 100 s)");
	cmp_ok($secs, '>=', 0.09, "$what: and at least one round trip: it went through the proxy");
	cmp_ok($calls, '>=', 1000, "$what: Redis ran a script for each ($calls)");
	cmp_ok($calls, '<=', 1001, "$what: and no more (at most the first one again with its body)");

	my $single = $node->safe_psql('postgres',
		"SET ratelimit.test_clock_ms = '$clock'; "
		  . "SELECT s, d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms, d.source "
		  . "FROM unnest($subjects_sql, $costs_sql) WITH ORDINALITY AS c(s, cost, i), "
		  . "LATERAL rl_consume('$twin', c.s, c.cost) d ORDER BY c.i");
	my @b = split /\n/, $batch;
	is(scalar @b, 1000, "$what: a row per subject");
	is_deeply(\@b, [ split /\n/, $single ], "$what: in input order, the answers 1,000 single calls give on a twin policy");
	my $granted = grep { /\|t\|/ } @b;
	my $denied = grep { /\|f\|/ } @b;
	cmp_ok($granted, '>', 100, "$what: many granted ($granted)");
	cmp_ok($denied, '>', 100, "$what: many denied ($denied)");
}

# Bad elements: refused with the contract's SQLSTATE before anything is charged.
for my $bad (
	[ "ARRAY['b_ok', NULL]", 'NULL', '22004', 'a NULL subject' ],
	[ "ARRAY['b_ok', 'b_ok2']", 'ARRAY[1, 0]', '22023', 'a cost of 0' ],
	[ "ARRAY['b_ok', 'b_ok2']", 'ARRAY[1, NULL]', '22004', 'a NULL cost' ],
	[ "ARRAY['b_ok', 'b_ok2']", 'ARRAY[1, 6]', '22023', 'a cost over the capacity' ],
	[ "ARRAY['b_ok', '']", 'NULL', '22023', 'an empty subject' ],
	[ "ARRAY['b_ok', 'b_ok2']", 'ARRAY[1]', '22023', 'fewer costs than subjects' ])
{
	my ($subjects, $costs, $state, $what) = @$bad;
	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT * FROM rl_consume_many('b.many', $subjects, ${costs}::bigint[])");
	like($err, qr/ERROR:  $state/, "$what: $state");
}
is($node->safe_psql('postgres', "SELECT remaining FROM rl_peek('b.many', 'b_ok', 5)"), '5',
	'and nothing was charged for the good elements');
my ($ret, $out, $err) = $node->psql('postgres', "SELECT * FROM rl_consume_many('b.missing', ARRAY['x'])");
like($err, qr/does not exist/, 'an unknown policy: 42704');
is($node->safe_psql('postgres', "SELECT count(*) FROM rl_consume_many('b.many', ARRAY[]::text[])"), '0',
	'no subjects: no rows');

# The statement trigger: 10,000 subjects in one INSERT, through the proxy.
$far->query_ok('RESET ratelimit.test_clock_ms');
my ($secs) = timed(sub {
	$far->query_ok("INSERT INTO b_rows SELECT 'row_' || g FROM generate_series(1, 10000) g", 120);
});
note sprintf('statement trigger over 10,000 subjects through a 100 ms round trip: %.3f s', $secs);
cmp_ok($secs, '<', 2, 'the statement trigger charges 10,000 subjects in one round trip (< 2 s; one by one: 1,000 s)');
is($node->safe_psql('postgres', "SELECT remaining FROM rl_peek('b.rows', 'row_1')") . '|'
	  . $node->safe_psql('postgres', "SELECT remaining FROM rl_peek('b.rows', 'row_10000')"),
	'2|2', 'each subject was charged its row');

# A statement that goes over for one subject: refused, and every other charge given back.
($secs, $out, $err) = timed(sub {
	$far->query("INSERT INTO b_rows SELECT 'row_' || g FROM generate_series(1, 10000) g "
		  . "UNION ALL SELECT 'row_1' UNION ALL SELECT 'row_1'", 120);
});
note sprintf('the same with one subject over its limit, refused and given back: %.3f s', $secs);
like($err, qr/rate limit exceeded for policy "b.rows"/, 'the statement over the limit is refused');
cmp_ok($secs, '<', 2, 'charges and refunds of 10,000 subjects: a few round trips (< 2 s)');
is($node->safe_psql('postgres', "SELECT remaining FROM rl_peek('b.rows', 'row_2')") . '|'
	  . $node->safe_psql('postgres', "SELECT remaining FROM rl_peek('b.rows', 'row_9999')"),
	'2|2', 'the other subjects were given their tokens back');
is($node->safe_psql('postgres', 'SELECT count(*) FROM b_rows'), '10000', 'and the rows were not written');

# Redis down: every subject is decided by its policy's fail mode, on its own.
is($node->safe_psql('postgres', "SET ratelimit.redis_url = 'redis://127.0.0.1:1'; "
	  . "SELECT string_agg(allowed || ' ' || source, ',') FROM rl_consume_many('b.open', ARRAY['d1', 'd2', 'd3'])"),
	'true fail_open,true fail_open,true fail_open', "Redis down: an 'open' policy's batch is allowed, fail_open");
is($node->safe_psql('postgres', "SET ratelimit.redis_url = 'redis://127.0.0.1:1'; "
	  . "SELECT string_agg(allowed || ' ' || source, ',') FROM rl_consume_many('b.many', ARRAY['d1', 'd2'])"),
	'false fail_closed,false fail_closed', "a 'closed' one's denied, fail_closed");

# Redis silent (paused) during a batch with a long deadline: a cancel ends it at once.
my $s = session($node, options => '-c ratelimit.command_timeout=60s');
my $pid = $s->query_ok('SELECT pg_backend_pid()');
$redis->pause;
$s->start_query("SELECT count(*) FROM rl_consume_many('b.many', "
	  . "ARRAY(SELECT 'c' || g FROM generate_series(1, 1000) g))");
usleep(300_000);
ok(!$s->done, 'a batch waits while Redis is silent');
my $cancelled_at = time;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
my ($cancel_out, $cancel_err) = $s->wait_result(10);
like($cancel_err, qr/canceling statement due to user request/, 'pg_cancel_backend cancels the batch');
cmp_ok(time - $cancelled_at, '<', 1, 'within a second of the cancel');
$redis->resume;
is($s->query_ok("SELECT source FROM rl_consume('b.many', 'after_cancel')"), 'redis',
	'and the session decides by Redis again');
$s->quit;

$far->quit;
$proxy->stop;
$node->stop;
$redis->stop;
done_testing();
