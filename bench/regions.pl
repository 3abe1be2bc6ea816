#!/usr/bin/perl
# The body of bench/regions: runs the simulation (RateLimitTest::Regions) and prints its
# report. Not a test: it asserts nothing, it measures.

use strict;
use warnings;

# PostgreSQL::Test::Utils sends STDOUT to its log: the report goes to the terminal's.
BEGIN { open(our $REPORT, '>&', \*STDOUT) or die "cannot dup STDOUT: $!"; }

use Test::More;    # the helpers report through it
use Time::HiRes qw(time sleep);

use RateLimitTest;
use RateLimitTest::Regions;

my $seconds = $ENV{RL_REGIONS_SECONDS} // 60;
my $world = RateLimitTest::Regions->new(rtt => { b => 40, c => 80 }, capacity => 20);
my $cap = $world->capacity;

my $steady_from = int(time * 1000);
$world->load($seconds, 2);
my $cut;
# The cut: 30 s in the middle of the second phase (shorter when the phase is shorter).
my $cut_seconds = $seconds >= 40 ? 30 : int($seconds / 2);
$world->load($seconds, 2, sub { sleep(($seconds - $cut_seconds) / 2); $cut = $world->partition('c', $cut_seconds) });
my $rows = $world->rows;

printf $main::REPORT "regions: a (home), b (40 ms), c (80 ms); fixed windows of %d a second; %d s steady, then %d s with c cut off for %d s; %d decisions\n\n",
  $cap, $seconds, $seconds, $cut_seconds, scalar @$rows;
foreach my $mode (qw(home split independent))
{
	my $policy = $RateLimitTest::Regions::POLICY{$mode};
	print $main::REPORT "== $mode ($policy)\n";
	foreach my $kind (qw(hot all mover))
	{
		my $per_second = RateLimitTest::Regions::grants_per_second($rows, $policy, $kind);
		my @cells;
		foreach my $span (1, 5, 10, 20)
		{
			my ($worst, $windows) = RateLimitTest::Regions::worst_ratio($per_second, $cap, $span);
			push @cells, sprintf('%2ds: worst %.2f', $span, $worst);
		}
		printf $main::REPORT "  admitted / limit, tenant %-5s  %s\n", $kind, join('  ', @cells);
	}
	foreach my $region (qw(a b c))
	{
		my @cells;
		foreach my $kind (qw(hot all cold))
		{
			my @l = RateLimitTest::Regions::latencies($rows, $policy, $kind, $region, $steady_from, $cut->[0]);
			next unless @l;
			push @cells, sprintf('%s p50 %.1f p99 %.1f ms', $kind,
				RateLimitTest::Regions::quantile(0.5, @l), RateLimitTest::Regions::quantile(0.99, @l));
		}
		printf $main::REPORT "  latency in %s: %s\n", $region, join(', ', @cells);
	}
	printf $main::REPORT "  (latency counts every answer: a denial the deny cache remembers takes no Redis call)\n";
	my ($granted, $asked, $sources) = RateLimitTest::Regions::outcomes($rows, $policy, 'c', $cut->[0], $cut->[1]);
	printf $main::REPORT "  c cut off %d s: %d of %d granted (%s)\n", $cut_seconds, $granted, $asked,
	  join(', ', map { "$_ $sources->{$_}" } sort keys %$sources);
	my %after = map { $_ => 1 } grep { $_ > $cut->[1] / 1000 } keys %{ RateLimitTest::Regions::grants_per_second($rows, $policy, 'all') };
	my $per_second = RateLimitTest::Regions::grants_per_second($rows, $policy, 'all');
	my %healed = map { $_ => $per_second->{$_} } grep { $after{$_} } keys %$per_second;
	my ($worst_after) = RateLimitTest::Regions::worst_ratio(\%healed, $cap, 1);
	printf $main::REPORT "  after the cut heals: worst 1-s window of the tenant asked everywhere %.2f\n", $worst_after;
	printf $main::REPORT "  stranded (limit nobody was granted, in windows where the hot tenant was denied): %.0f %%\n\n",
	  100 * RateLimitTest::Regions::stranded($rows, $policy, $cap);
}
done_testing();
