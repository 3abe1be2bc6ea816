#!/usr/bin/perl
#
# One budget across regions, on loopback (RateLimitTest::Regions): three regions, each a
# Redis and a PostgreSQL server, the far ones 40 and 80 ms from the home region's Redis.
# Under a skewed load, the strict modes (home, split) never grant more than the policy in
# any window, not while a region is cut off from the home region, nor when a region's
# Redis and PostgreSQL are killed (kill -9) and restarted; the independent mode grants at
# most the number of regions times the policy. Home decisions in a far region pay its round
# trip; split ones are decided in the region. bench/regions runs the same, longer, and
# reports the figures docs/regions.md publishes.

use strict;
use warnings;

use Test::More;
use Time::HiRes qw(time sleep);

use RateLimitTest;
use RateLimitTest::Regions;

my $world = RateLimitTest::Regions->new(rtt => { b => 40, c => 80 }, capacity => 20);
my $cap = $world->capacity;
my ($a, $b, $c) = map { $world->node($_) } qw(a b c);

# Set-up errors say what to do.
$b->psql('postgres', q{UPDATE rl_policy SET region_mode = 'split' WHERE name = 'rg.ind'}, stderr => \my $e1);
like($e1, qr/rl_policy_home_region_check/, 'a split policy names its home region');
$b->psql('postgres', q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, region_mode, home_region)
	VALUES ('rg.tb', 10, 10, '1 second', 'split', 'a')}, stderr => \my $e2);
like($e2, qr/rl_policy_region_split_check/, 'split is for fixed windows');
$b->safe_psql('postgres', q{INSERT INTO rl_policy (name, algorithm, capacity, refill_period, region_mode, home_region)
	VALUES ('rg.nowhere', 'fixed_window', 10, '1 second', 'home', 'zz')});
$b->psql('postgres', q{SELECT rl_consume('rg.nowhere', 'x')}, stderr => \my $e3, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($e3, qr/55000.*home region "zz".*HINT:.*ratelimit\.regions/s, 'a home region not listed: 55000 and a hint');
$b->psql('postgres', q{SELECT rl_consume('rg.split', 'x', max_wait => '1 s')}, stderr => \my $e4,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($e4, qr/0A000.*splits its budget/s, 'max_wait on a split policy: 0A000');
$b->psql('postgres', q{SELECT * FROM rl_consume_all(ARRAY['rg.home', 'rg.ind'], ARRAY['x', 'x'])},
	stderr => \my $e5, extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($e5, qr/0A000.*one Redis/s, 'rl_consume_all across Redis servers: 0A000');
is($b->safe_psql('postgres', q{SELECT count(*) FROM pg_settings WHERE name = 'ratelimit.regions'},
		extra_params => [ '-U', 'postgres' ]), '1', 'ratelimit.regions is a setting');

$b->psql('postgres', q{SELECT rl_settle('rg.split', 'x', 1, 5)}, stderr => \my $e6,
	extra_params => [ '-v', 'VERBOSITY=verbose' ]);
like($e6, qr/0A000.*splits its budget/s, 'settling a split policy up: 0A000');

# A region_base of the whole capacity is bounded: with three regions each far region's
# share is at most half of it, and all of them together grant the capacity, not twice it.
{
	my %granted = map {
		my $node = $world->node($_);
		$_ => $node->safe_psql('postgres',
			q{SELECT count(*) FILTER (WHERE allowed) FROM generate_series(1, 30) g, LATERAL rl_consume('rg.wide', 'w' || (g * 0)) d})
	} qw(b c a);
	is(join(',', map { $granted{$_} } qw(a b c)), join(',', 0, $cap / 2, $cap / 2),
		"region_base of the whole capacity: b and c grant half each, a the rest (none): $cap in all");
	is($b->safe_psql('postgres', q{SELECT remaining FROM rl_peek('rg.split', 'fresh_peek')}), int($cap / 6),
		'a split policy\'s peek reads the region\'s share of the window');
	is($b->safe_psql('postgres', q{SELECT used || '/' || "limit" FROM rl_usage('rg.split', 'fresh_peek')}),
		'0/' . int($cap / 6), 'and rl_usage tells the region\'s share as its limit');
}

# Where each mode keeps its state: home in a's Redis only, split in both, independent in b's.
foreach my $policy (qw(rg.home rg.split rg.ind))
{
	$b->safe_psql('postgres', "SELECT rl_consume('$policy', 'probe')");
}
my @in_a = grep { /probe/ } $world->redis('a')->scan_keys('*');
my @in_b = grep { /probe/ } $world->redis('b')->scan_keys('*');
ok((grep { /rg\.home/ } @in_a) && !(grep { /rg\.home/ } @in_b), 'home: the decision is in the home region\'s Redis');
ok((grep { /rg\.ind/ } @in_b) && !(grep { /rg\.ind/ } @in_a), 'independent: in the region\'s own Redis');
ok((grep { /rg\.split/ } @in_b), 'split: the share is counted in the region\'s own Redis');

# The load: 12 s steady, then 12 s with region c cut off for 5 s in the middle, then 12 s
# with region c's Redis and PostgreSQL killed and restarted, then the home region's Redis.
my $steady = $world->load(12, 2);
ok($steady->{$_}, "steady load ran in region $_") foreach qw(a b c);
my $cut;
my $partitioned = $world->load(12, 2, sub { sleep 3; $cut = $world->partition('c', 5) });
ok($partitioned->{$_}, "load with region c cut off ran in region $_") foreach qw(a b c);
my $killed_at;
$world->load(12, 2, sub {
	sleep 3;
	$killed_at = int(time * 1000);
	$world->redis('c')->kill9;
	$c->kill9;
	sleep 1;
	$world->redis('c')->start;
	# The killed postmaster's backends leave once they see it gone: start when they have.
	my $started = 0;
	for (1 .. 30)
	{
		last if ($started = $c->start(fail_ok => 1));
		# A failed start read the dead postmaster's pid file: it is not running.
		$c->{_pid} = undef;
		sleep 0.5;
	}
	ok($started, 'region c\'s PostgreSQL starts again after kill -9');
	# Region c's load is gone with its server: a new one for the rest, during which the
	# home region's Redis is killed and restarted too (from its append-only file: what it
	# counted, the leases of the other regions among it, is there again).
	my $c_load = $world->load_start('c', 6, 2);
	sleep 2;
	$world->redis('a')->kill9;
	sleep 0.5;
	$world->redis('a')->start;
	$c_load->{handle}->finish;
});
my $rows = $world->rows;
note scalar(@$rows) . ' takes recorded';

foreach my $mode (qw(home split))
{
	my $policy = $RateLimitTest::Regions::POLICY{$mode};
	foreach my $kind (qw(hot all mover))
	{
		my $per_second = RateLimitTest::Regions::grants_per_second($rows, $policy, $kind);
		foreach my $span (1, 5)
		{
			my ($worst, $windows) = RateLimitTest::Regions::worst_ratio($per_second, $cap, $span);
			cmp_ok($worst, '<=', 1, "$mode, $kind: never over the policy in any ${span}-s window ($windows windows, worst $worst)");
		}
	}
	my ($worst) = RateLimitTest::Regions::worst_ratio(
		RateLimitTest::Regions::grants_per_second($rows, $policy, 'all'), $cap, 1);
	cmp_ok($worst, '>=', 0.5, "$mode: the tenant asked everywhere is granted a good part of its limit ($worst)");
}

# Independent: each region alone, so up to 3x the policy in a window, never more.
{
	my $per_second = RateLimitTest::Regions::grants_per_second($rows, 'rg.ind', 'all');
	my ($worst) = RateLimitTest::Regions::worst_ratio($per_second, $cap, 1);
	cmp_ok($worst, '>', 1, "independent: over the policy when every region asks ($worst)");
	cmp_ok($worst, '<=', 3, 'independent: never over 3 (the regions) times the policy');
}

# Latency: far home decisions pay the round trip, split ones in the region do not.
{
	my @home_c = RateLimitTest::Regions::latencies($rows, 'rg.home', 'cold', 'c', 0, $cut->[0]);
	my @split_c = RateLimitTest::Regions::latencies($rows, 'rg.split', 'cold', 'c', 0, $cut->[0]);
	my ($home_p50, $split_p50) = map { RateLimitTest::Regions::quantile(0.5, @$_) } \@home_c, \@split_c;
	note "region c, cold subjects: home p50 $home_p50 ms, split p50 $split_p50 ms";
	cmp_ok($home_p50, '>=', 75, 'home: a cold subject in region c waits the 80 ms round trip');
	cmp_ok($split_p50, '<', 40, 'split: a cold subject in region c is decided from its share, in the region');
}

# The partition: region c's home decisions go to their fail mode (closed), its split
# ones go on from its share; nothing over the policy after it heals (checked above).
{
	my ($home_granted, $home_asked, $home_sources) =
	  RateLimitTest::Regions::outcomes($rows, 'rg.home', 'c', $cut->[0] + 1000, $cut->[1]);
	my ($split_granted, $split_asked) =
	  RateLimitTest::Regions::outcomes($rows, 'rg.split', 'c', $cut->[0] + 1000, $cut->[1]);
	note "cut off: home $home_granted of $home_asked granted, split $split_granted of $split_asked";
	ok($home_asked > 0 && $home_granted == 0, 'cut off: region c grants nothing of a home policy');
	ok(($home_sources->{fail_closed} // 0) + ($home_sources->{deny_cache} // 0) == $home_asked,
		'cut off: its home decisions are the fail mode\'s');
	cmp_ok($split_granted, '>', 0, 'cut off: region c still grants a split policy from its share');
}

# Noisy neighbours: the cut (the home region's breaker open in region c) moves nothing for
# a victim on a policy of region c's own Redis: its cold subjects are granted by Redis, as
# in the steady run.
{
	my ($granted, $asked, $sources) =
	  RateLimitTest::Regions::outcomes($rows, 'rg.ind', 'c', $cut->[0] + 1000, $cut->[1]);
	my @cold = grep { $_->[1] eq 'rg.ind' && $_->[2] eq 'cold' && $_->[0] eq 'c'
		  && $_->[3] >= $cut->[0] + 1000 && $_->[3] < $cut->[1] } @$rows;
	ok(@cold > 0 && !(grep { !$_->[5] || $_->[7] ne 'redis' } @cold),
		'cut off: a victim on region c\'s own Redis is granted by Redis, as in the control');
	my @control = RateLimitTest::Regions::latencies($rows, 'rg.ind', 'cold', 'c', 0, $cut->[0]);
	my @victim = map { $_->[4] / 1000 } @cold;
	note sprintf('victim p50: control %.2f ms, cut %.2f ms',
		RateLimitTest::Regions::quantile(0.5, @control), RateLimitTest::Regions::quantile(0.5, @victim));
}

# After the kill: region c decides again, from its Redis restarted with what it counted.
{
	my ($granted, $asked) = RateLimitTest::Regions::outcomes($rows, 'rg.split', 'c', $killed_at + 1500, $killed_at + 60000);
	cmp_ok($granted, '>', 0, "region c decides again after kill -9 and restart ($granted of $asked)");
}

done_testing();
