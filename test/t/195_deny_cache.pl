#!/usr/bin/perl
#
# The deny cache, on the real clock: a denial from Redis is remembered in shared memory
# until its retry-after, and the same cost asked meanwhile, by any backend of the server,
# is denied here (source 'deny_cache') without a Redis call, with the time still to wait;
# the next grant comes on time; a refund or reset made here forgets it; a policy with
# deny_cache = false asks Redis every time.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'deny_cache');
my $node = rl_node('deny_cache', redis => $redis, max_connections => 40);
my $dir = PostgreSQL::Test::Utils::tempdir();

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('dc.hot', 1, 1, '20 s', 'closed'),
	  ('dc.ontime', 1, 1, '2 s', 'closed'),
	  ('dc.refund', 1, 1, '1 hour', 'closed');
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period, fail_mode) VALUES
	  ('dc.window', 'fixed_window', 1, '1 hour', 'closed');
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, deny_cache) VALUES
	  ('dc.off', 1, 1, '1 hour', 'closed', false);
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('dc.rollback', 1, 1, '1 hour', 'closed'),
	  ('dc.race', 100, 1, '1 day', 'closed'),
	  ('dc.hostile', 1, 1, '2 s', 'closed');
	CREATE TABLE race_log (allowed boolean);
	CREATE TABLE seen (source text, allowed boolean, retry bigint);
});

sub decide
{
	my ($policy, $subject, $cost) = @_;
	return $node->safe_psql('postgres',
		"SELECT allowed, source, retry_after_ms FROM rl_consume('$policy', '$subject', " . ($cost // 1) . ')');
}
sub evalsha { return $redis->command_calls('evalsha') + $redis->command_calls('eval') }

# A subject denied for about 20 s, hammered by 16 clients.
my ($allowed) = split /\|/, decide('dc.hot', 'hot');
is($allowed, 't', 'the first take is granted');
my ($a, $source, $retry) = split /\|/, decide('dc.hot', 'hot');
is("$a|$source", 'f|redis', 'the next is denied by Redis');
cmp_ok($retry, '>', 15000, "with a retry-after of about 20 s ($retry ms)");
my $before = evalsha();
my $file = "$dir/hammer.sql";
append_to_file($file,
	"INSERT INTO seen SELECT source, allowed, retry_after_ms FROM rl_consume('dc.hot', 'hot');\n");
my $started = time;
run_pgbench($node, 'hammer', $file, 16, 40);
my $calls = evalsha() - $before;
note sprintf('640 calls on a subject denied for 20 s, within %.2f s: %d Redis calls', time - $started, $calls);
is($node->safe_psql('postgres', "SELECT count(*) FROM seen WHERE NOT allowed AND source = 'deny_cache'"),
	'640', '16 clients x 40 calls: every one denied from the cache');
is($calls, 0, 'Redis saw no call for the subject meanwhile');
is($node->safe_psql('postgres', "SELECT count(*) FROM seen WHERE retry <= 0 OR retry > $retry"), '0',
	'each told a retry-after within what Redis said');

# The next grant comes on time: denied from the cache until the retry-after has passed,
# then Redis is asked again and grants.
decide('dc.ontime', 'ot');
my $granted_at = time;
($a, $source, $retry) = split /\|/, decide('dc.ontime', 'ot');
is("$a|$source", 'f|redis', 'a 2 s subject: denied by Redis');
my $wait = $granted_at + ($retry - 300) / 1000 - time;
usleep($wait * 1e6) if $wait > 0;
($a, $source) = split /\|/, decide('dc.ontime', 'ot');
is("$a|$source", 'f|deny_cache', '300 ms before the retry-after: still denied, from the cache');
$wait = $granted_at + ($retry + 50) / 1000 - time;
usleep($wait * 1e6) if $wait > 0;
($a, $source) = split /\|/, decide('dc.ontime', 'ot');
is("$a|$source", 't|redis', 'once it has passed: Redis is asked, and grants on time');

# A refund made here forgets the denial: the next take goes to Redis (and is granted).
decide('dc.refund', 'r1');
($a, $source) = split /\|/, decide('dc.refund', 'r1');
is("$a|$source", 'f|redis', 'denied by Redis');
($a, $source) = split /\|/, decide('dc.refund', 'r1');
is("$a|$source", 'f|deny_cache', 'then from the cache');
$node->safe_psql('postgres', "SELECT rl_refund('dc.refund', 'r1', 1)");
($a, $source) = split /\|/, decide('dc.refund', 'r1');
is("$a|$source", 't|redis', 'after a refund here: Redis is asked, and grants');
($a, $source) = split /\|/, decide('dc.refund', 'r1');
is("$a|$source", 'f|redis', 'denied again');
$node->safe_psql('postgres', "SELECT rl_reset('dc.refund', 'r1')");
($a, $source) = split /\|/, decide('dc.refund', 'r1');
is("$a|$source", 't|redis', 'after a reset here: Redis grants');

# A larger cost is denied from the cache too, told to wait longer by the time its extra
# tokens take to refill (one token every 20 minutes here): what Redis says for it, or at
# most 1 ms more. A sliding window's longer wait depends on what it counted: Redis is asked.
$node->safe_psql('postgres', q{
	UPDATE rl_policy SET capacity = 3, refill_amount = 3 WHERE name = 'dc.refund'});
decide('dc.refund', 'r2', 3);
my $asked_at = time;
($a, $source, $retry) = split /\|/, decide('dc.refund', 'r2', 1);
is("$a|$source", 'f|redis', 'cost 1 denied by Redis');
my $cached_at = time;
my ($a2, $source2, $retry2) = split /\|/, decide('dc.refund', 'r2', 2);
my $elapsed_ms = (time - $asked_at) * 1000;
is("$a2|$source2", 'f|deny_cache', 'a larger cost: denied from the cache');
cmp_ok($retry2, '<=', $retry + 1200000 + 1, "its wait: cost 1's and 20 minutes, at most ($retry2 ms)");
cmp_ok($retry2, '>=', $retry + 1200000 - $elapsed_ms - 1, 'at least that, less the time passed');
my ($a3, $source3, $retry3) = split /\|/, $node->safe_psql('postgres',
	q{SELECT allowed, source, retry_after_ms FROM rl_peek('dc.refund', 'r2', 2)});
# Apart by at most the time between the two answers (from before the cached one to after Redis's).
cmp_ok(abs($retry3 - $retry2), '<=', (time - $cached_at) * 1000 + 2, "Redis says the same for cost 2 ($retry3 ms)");
$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES ('dc.sliding', 'sliding_window', 3, '1 hour')});
decide('dc.sliding', 's1', 2);
decide('dc.sliding', 's1', 2);
($a, $source) = split /\|/, decide('dc.sliding', 's1', 3);
is("$a|$source", 'f|redis', 'a sliding window\'s larger cost goes to Redis');

# A window's denial lasts until the window ends: remembered as well.
decide('dc.window', 'w1');
decide('dc.window', 'w1');
($a, $source) = split /\|/, decide('dc.window', 'w1');
is("$a|$source", 'f|deny_cache', 'a fixed window\'s denial is remembered');
# rl_headers tells a cached denial as Redis's: the limit, r=0, and Retry-After.
like($node->safe_psql('postgres', q{SELECT d.source || ' ' || rl_headers(d)::text FROM rl_consume('dc.window', 'w1') d}),
	qr/^deny_cache .*"RateLimit": "\\"dc\.window\\";r=0;t=\d+".*"Retry-After": "\d+"/,
	'rl_headers of a cached denial: RateLimit with r=0, and Retry-After');

# A reservation rolled back here forgets the denial as a refund does: the next take is
# Redis's (0.8.0 kept denying it from the cache for the whole retry-after).
my $holder = session($node);
$holder->query_ok(q{BEGIN; SELECT allowed FROM rl_reserve('dc.rollback', 'rb')});
($a, $source) = split /\|/, decide('dc.rollback', 'rb');
is("$a|$source", 'f|redis', 'while a reservation holds the token: denied by Redis');
($a, $source) = split /\|/, decide('dc.rollback', 'rb');
is("$a|$source", 'f|deny_cache', 'then from the cache');
$holder->query_ok('ROLLBACK');
($a, $source) = split /\|/, decide('dc.rollback', 'rb');
is("$a|$source", 't|redis', 'after the reservation is rolled back: Redis grants');
$holder->quit;

# Denials decided before a refund made here, and remembered after it, would hide the
# refund: 32 clients each commit 8 reservations and roll back 8, on 100 tokens. Afterwards
# what was granted and committed and what Redis holds make exactly 100, and what Redis holds
# is granted at once, by Redis: no denial remembered from before a refund stands in its way.
my $race_file = "$dir/race.sql";
append_to_file($race_file, q{BEGIN;
INSERT INTO race_log SELECT allowed FROM rl_reserve('dc.race', 'race');
COMMIT;
BEGIN;
SELECT allowed FROM rl_reserve('dc.race', 'race');
ROLLBACK;
});
run_pgbench($node, 'race', $race_file, 32, 8);
my $committed = $node->safe_psql('postgres', 'SELECT count(*) FROM race_log WHERE allowed');
my $held = $node->safe_psql('postgres', q{SELECT remaining FROM rl_peek('dc.race', 'race')});
note "the race: $committed reservations committed, $held tokens left in Redis";
is($committed + $held, 100, 'what was committed and what Redis holds make exactly 100');
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE d.allowed AND d.source = 'redis') FROM generate_series(1, $held) g, "
		  . "LATERAL rl_consume('dc.race', 'race', 1 + 0 * g) d"),
	$held, "the $held tokens left are granted, by Redis");

# A hostile (or broken) Redis that says "retry after 10^12 ms" keeps the subject denied
# here for no longer than the policy could make anyone wait (a full refill: 2 s), not for
# 31 years after Redis is healthy again.
{
	my $fake = fake_redis_start(
		reply => sub { $_[0] =~ /^EVAL/ ? "*4\r\n:0\r\n:0\r\n:1000000000000\r\n:1000000000000\r\n" : "+OK\r\n" });
	$node->safe_psql('postgres', 'ALTER SYSTEM SET ratelimit.redis_url = ' . quote_literal($fake->url));
	$node->reload;
	$node->poll_query_until('postgres', q{SELECT current_setting('ratelimit.redis_url') LIKE '%} . $fake->port . q{'})
	  or die 'the fake Redis is not the server\'s';
	my ($ha, $hs, $hr) = split /\|/, decide('dc.hostile', 'h');
	is("$ha|$hs|$hr", 'f|redis|1000000000000', 'the hostile Redis denies, for 10^12 ms');
	$node->safe_psql('postgres', 'ALTER SYSTEM RESET ratelimit.redis_url');
	$node->reload;
	$node->poll_query_until('postgres', q{SELECT current_setting('ratelimit.redis_url') NOT LIKE '%} . $fake->port . q{'})
	  or die 'the real Redis is not back';
	$fake->stop;
	($ha, $hs) = split /\|/, decide('dc.hostile', 'h');
	is("$ha|$hs", 'f|deny_cache', 'its denial is remembered');
	usleep(2_100_000);
	($ha, $hs) = split /\|/, decide('dc.hostile', 'h');
	is("$ha|$hs", 't|redis', 'but for no longer than a full refill (2 s): then the healthy Redis grants');
}

# deny_cache = false: every denial is Redis's.
decide('dc.off', 'o1');
$before = evalsha();
my @sources = map { (split /\|/, decide('dc.off', 'o1'))[1] } 1 .. 5;
is_deeply(\@sources, [ ('redis') x 5 ], 'a policy with deny_cache = false asks Redis every time');
is(evalsha() - $before, 5, 'five calls');

cmp_ok($node->safe_psql('postgres', "SELECT source_deny_cache FROM rl_stats WHERE policy = 'dc.hot'"),
	'>=', 640, 'rl_stats counts the decisions of the deny cache');
cmp_ok(0 + $node->safe_psql('postgres', "SELECT source_deny_cache FROM rl_stats WHERE policy = 'dc.off'"),
	'==', 0, 'none for the policy without it');

$node->stop;
$redis->stop;
done_testing();
