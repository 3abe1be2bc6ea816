#!/usr/bin/perl
#
# Every script is bounded at every value the constraints accept: Redis runs one script at a
# time, so a slow one is everyone's outage. Each algorithm's every script runs here at its
# bounds against a private redis-server, with an injected clock (ARGV[1] = now in ms): the
# largest capacity and cost the table accepts, the fullest state (a sliding log of 10,000
# requests of one token, the log 0.8.0 wrote with a member per token, 100,000 leases live
# or expired), the most checks of one rl_consume_all (32). Redis's own measurement says how
# long each call ran: the CPU time of its main thread (INFO CPU) and the wall time (SLOWLOG,
# every command logged); the median of 5 runs, each from the same state, must be at most
# 5 ms of CPU (the figures, far below, are noted: docs/algorithms.md). Each reply is
# checked too, so that a fast error never passes for a bounded script.

use strict;
use warnings;

use FindBin;
use Test::More;

use lib $FindBin::Bin;
use RateLimitTest;

my $BOUND_US = 5000;
my $RUNS = 5;
my $T0 = 1_800_000_000_000;
my $DAY = 86_400_000;

my $redis = redis_start(
	name => 'script_bounds',
	args => [ '--slowlog-log-slower-than', '0', '--slowlog-max-len', '32' ]);
my $db = $redis->client;
my $compose = "$FindBin::Bin/../../dev/lua-script";

# Loads lua/<name>.lua as the build composes it.
my %sha;
for my $name (
	qw(token_bucket/take_one token_bucket/peek token_bucket/refund token_bucket/slice
	gcra/take_one gcra/peek gcra/refund gcra/slice fixed_window/take_one fixed_window/peek
	fixed_window/refund fixed_window/slice sliding_window/take sliding_window/peek
	sliding_window/refund sliding_log/take sliding_log/peek sliding_log/refund
	concurrency/acquire concurrency/release concurrency/peek concurrency/leave group reset
	token_bucket/book token_bucket/owe gcra/book gcra/owe fixed_window/book fixed_window/owe
	fixed_window/take fixed_window/take+once
	token_bucket/take_one+once token_bucket/book+once sliding_log/take+once group+once
	region/share_one region/lease_one region/deposit_one))
{
	# name+once: the script made once per request id (lua/once.lua).
	my ($file, $once) = $name =~ /^(.*?)(\+once)?$/;
	local $ENV{RL_LUA_ONCE} = $once ? 1 : 0;
	my $body = `"$compose" "$FindBin::Bin/../../lua/$file.lua"`;
	die "cannot compose $name" if $? != 0;
	my $sha = $db->command('SCRIPT', 'LOAD', $body);
	die "SCRIPT LOAD $name failed" unless !ref $sha && $sha =~ /^[0-9a-f]{40}$/;
	$sha{$name} = $sha;
}

sub reply_text
{
	my ($r) = @_;
	return RateLimitTest::RespClient::is_error($r) ? 'error: ' . $r->msg
	  : ref $r eq 'ARRAY' ? '{' . join(', ', map { $_ // 'nil' } @$r) . '}'
	  : $r;
}

# The microseconds of wall time Redis spent on the last EVALSHA, as its SLOWLOG says.
sub last_script_us
{
	for my $entry (@{ $db->command('SLOWLOG', 'GET', 32) })
	{
		return $entry->[2] if uc($entry->[3][0]) eq 'EVALSHA';
	}
	die 'no EVALSHA in the SLOWLOG';
}

# The CPU time of Redis's main thread in us, from a reply of INFO CPU.
sub main_thread_us
{
	my ($info) = @_;
	my ($sys) = $info =~ /^used_cpu_sys_main_thread:([\d.]+)/m;
	my ($user) = $info =~ /^used_cpu_user_main_thread:([\d.]+)/m;
	die 'INFO CPU has no main thread times' unless defined $sys && defined $user;
	return ($sys + $user) * 1e6;
}

# Waits until Redis has freed in the background what the last runs deleted (UNLINK), so
# that no run pays for another's.
sub settle
{
	for (1 .. 500)
	{
		return if $db->command('INFO', 'memory') =~ /^lazyfree_pending_objects:0\r?$/m;
		select(undef, undef, undef, 0.002);
	}
	die 'Redis did not free what was deleted';
}

sub median { my @v = sort { $a <=> $b } @_; return $v[ int(@v / 2) ] }

# Runs script $name with keys and args $RUNS times, after prepare and each time after setup
# (which puts the same state back, where a run changes it more than a little), checks every
# reply against $want (a regex), and asserts that the median of
# Redis's time is within the bound. That time is the CPU time of Redis's main thread over
# the call (INFO CPU just before and after it, in the same pipeline): on a busy shared
# machine the wall time (SLOWLOG, noted too) also holds the time Redis waited for a core.
sub bounded
{
	my ($label, %call) = @_;
	my (@cpu, @wall, @bad);
	$call{prepare}->() if $call{prepare};
	for (1 .. $RUNS)
	{
		$call{setup}->() if $call{setup};
		settle();
		$db->command('SLOWLOG', 'RESET');
		my ($before, $r, $after) = $db->pipeline(
			[ 'INFO', 'CPU' ],
			[ 'EVALSHA', $sha{ $call{script} }, scalar(@{ $call{keys} }), @{ $call{keys} }, @{ $call{args} } ],
			[ 'INFO', 'CPU' ]);
		push @cpu, main_thread_us($after) - main_thread_us($before);
		push @wall, last_script_us();
		push @bad, reply_text($r) unless reply_text($r) =~ $call{want};
	}
	my ($cpu, $wall) = (median(@cpu), median(@wall));
	note(sprintf('%-62s median %5d us of CPU, %5d us wall (%s)', $label, $cpu, $wall,
			join(' ', map { sprintf('%d/%d', $cpu[$_], $wall[$_]) } 0 .. $#cpu)));
	is(join('; ', @bad), '', "$label: the expected answer");
	cmp_ok($cpu, '<=', $BOUND_US, "$label: at most 5 ms of Redis time");
	return $cpu;
}

# Copies template key $from onto each key (the same state for every run).
sub copies
{
	my ($from, @to) = @_;
	return sub { $db->pipeline(map { [ 'COPY', $from, $_, 'REPLACE' ] } @to) };
}

#
# The token bucket, GCRA, the fixed and the sliding window: O(1) each, at their largest
# numbers (capacity units just below 2^53, GCRA's rate of 512 with a tolerance below 2^52,
# a sliding window's capacity * window below 2^51), a cost of the whole capacity.
#
subtest 'token bucket, gcra, fixed and sliding window at their bounds' => sub {
	my $cap = 9_007_199_254_740_990;    # 2^53 - 2: capacity units + rate below 2^53 (1 a ms)
	my $ttl = 4_503_599_627_370_496;    # 2^52 ms, the longest idle_ttl
	my @tb = ($cap, 1, 1, $cap, $ttl);
	bounded('token_bucket take_one: cost = capacity = 2^53 - 2',
		setup => sub { $db->command('DEL', 'tb') }, script => 'token_bucket/take_one',
		keys => ['tb'], args => [ $T0, @tb ], want => qr/^\{1, 0, 0, $cap\}$/);
	bounded('token_bucket peek', script => 'token_bucket/peek', keys => ['tb'],
		args => [ $T0, @tb ], want => qr/^\{0, 0, $cap, $cap\}$/);
	bounded('token_bucket refund', setup => sub { $db->command('SET', 'tb', "0 $T0") },
		script => 'token_bucket/refund', keys => ['tb'], args => [ $T0, @tb ],
		want => qr/^\{1, $cap, 0, 0\}$/);
	bounded('token_bucket slice', setup => sub { $db->command('DEL', 'tb') },
		script => 'token_bucket/slice', keys => ['tb'], args => [ $T0, @tb, $cap ],
		want => qr/^\{$cap, 0, 0, $cap\}$/);

	# 512 per ms (rate 512, unit 1): a tolerance of 2^52 - 1 units, the most accepted.
	my $tol = 4_503_599_627_370_495;    # 2^52 - 1
	my @g = ($tol, 512, 1, $tol, 0);
	my $reset = int(($tol + 511) / 512);
	bounded('gcra take_one: rate 512, cost = capacity = 2^52 - 1',
		setup => sub { $db->command('DEL', 'g') }, script => 'gcra/take_one', keys => ['g'],
		args => [ $T0, @g ], want => qr/^\{1, 0, 0, $reset\}$/);
	bounded('gcra peek', script => 'gcra/peek', keys => ['g'], args => [ $T0, @g ],
		want => qr/^\{0, 0, $reset, $reset\}$/);
	bounded('gcra refund', script => 'gcra/refund', keys => ['g'], args => [ $T0, @g ],
		want => qr/^\{1, $tol, 0, 0\}$/);
	bounded('gcra slice', setup => sub { $db->command('DEL', 'g') }, script => 'gcra/slice',
		keys => ['g'], args => [ $T0, @g, $tol ], want => qr/^\{$tol, 0, 0, $reset\}$/);

	my @f = ($cap, $cap, 1000, 2000);
	bounded('fixed_window take_one: cost = capacity = 2^53 - 2',
		setup => sub { $db->command('DEL', 'f') }, script => 'fixed_window/take_one',
		keys => ['f'], args => [ '', @f ], want => qr/^\{1, 0, 0, 1000\}$/);
	bounded('fixed_window peek', script => 'fixed_window/peek', keys => ['f'],
		args => [ '', @f ], want => qr/^\{0, 0, 1000, 1000\}$/);
	bounded('fixed_window refund', setup => sub { $db->command('SET', 'f', $cap) },
		script => 'fixed_window/refund', keys => ['f'], args => [ '', @f ],
		want => qr/^\{1, $cap, 0, 0\}$/);
	bounded('fixed_window slice', setup => sub { $db->command('DEL', 'f') },
		script => 'fixed_window/slice', keys => ['f'], args => [ '', @f, $cap ],
		want => qr/^\{$cap, 0, 0, 1000\}$/);

	# Rollover (0.12.0): capacity + rollover below 2^53, all of it carried (the previous
	# window never written) and taken at once, then made once; a previous window that owes
	# carries nothing; peek, refund, slice and owe of a window with rollover.
	my $carry = 4_503_599_627_370_494;    # 2^52 - 2: capacity 2^52 + this = 2^53 - 2
	my $half52 = 4_503_599_627_370_496;
	my @r = ($half52, $cap, 1000, 2000, $carry);
	bounded('fixed_window take with rollover: the limit 2^53 - 2, all taken',
		setup => sub { $db->command('DEL', 'f', 'f0') }, script => 'fixed_window/take',
		keys => [ 'f', 'f0' ], args => [ '', @r ], want => qr/^\{1, 0, 0, 1000, $cap\}$/);
	bounded('fixed_window peek with rollover', script => 'fixed_window/peek', keys => [ 'f', 'f0' ],
		args => [ '', @r ], want => qr/^\{0, 0, 1000, 1000, $cap\}$/);
	bounded('fixed_window refund with rollover', script => 'fixed_window/refund', keys => [ 'f', 'f0' ],
		args => [ '', @r ], want => qr/^\{1, $cap, 0, 0\}$/);
	bounded('fixed_window slice with rollover', setup => sub { $db->command('DEL', 'f', 'f0') },
		script => 'fixed_window/slice', keys => [ 'f', 'f0' ], args => [ '', @r, $cap ],
		want => qr/^\{$cap, 0, 0, 1000\}$/);
	bounded('fixed_window owe with rollover', setup => sub { $db->command('DEL', 'f', 'f0') },
		script => 'fixed_window/owe', keys => [ 'f', 'f0' ], args => [ '', $half52, 1, 1000, 2000, $carry, 1000 ],
		want => qr/^\{1, \d+, 0, 1000\}$/);
	bounded('fixed_window take with rollover made once',
		setup => sub { $db->command('DEL', 'f', 'f0', 'f:r') }, script => 'fixed_window/take+once',
		keys => [ 'f', 'f0', 'f:r' ], args => [ '', @r, 604_800_000 ], want => qr/^\{1, 0, 0, 1000, $cap, 0\}$/);
	bounded('fixed_window take with rollover: a previous window that owes carries nothing',
		setup => sub { $db->command('DEL', 'f'); $db->command('SET', 'f0', "$cap:$carry") },
		script => 'fixed_window/take', keys => [ 'f', 'f0' ], args => [ '', $half52, 1, 1000, 2000, $carry ],
		want => qr/^\{1, 4503599627370495, 0, 1000, 4503599627370496\}$/);
	bounded('group: a window with rollover (tag 6)', setup => sub { $db->command('DEL', 'f', 'f0') },
		script => 'group', keys => [ 'f', 'f0' ], args => [ '', 6, @r ], want => qr/^\{1, 0, 0, 1000\}$/);

	# capacity * window below 2^51: 2^31 - 1 per 2^20 ms.
	my ($scap, $w) = (2**31 - 1, 2**20);
	my @s = ($scap, $scap, $w, 1000);
	bounded('sliding_window take: cost = capacity, capacity * window < 2^51',
		setup => sub { $db->command('DEL', 's1', 's0') }, script => 'sliding_window/take',
		keys => [ 's1', 's0' ], args => [ '', @s ], want => qr/^\{1, 0, 0, \d+\}$/);
	bounded('sliding_window peek', script => 'sliding_window/peek', keys => [ 's1', 's0' ],
		args => [ '', @s ], want => qr/^\{0, 0, \d+, \d+\}$/);
	bounded('sliding_window refund', script => 'sliding_window/refund',
		keys => [ 's1', 's0' ], args => [ '', @s ], want => qr/^\{1, $scap, 0, \d+\}$/);

	my @t32 = map { "tb:$_" } 1 .. 32;
	bounded('group: 32 token buckets (the most checks), all granted',
		setup => sub { $db->command('DEL', @t32) }, script => 'group', keys => \@t32,
		args => [ $T0, map { (1, @tb[0 .. 2], 1, $ttl) } 1 .. 32 ], want => qr/^\{1, /);
	bounded('group made once: 32 token buckets, then their id',
		setup => sub { $db->command('DEL', @t32, 'tb:1:request') }, script => 'group+once',
		keys => [ @t32, 'tb:1:request' ],
		args => [ $T0, (map { (1, @tb[0 .. 2], 1, $ttl) } 1 .. 32), 604_800_000 ], want => qr/^\{1, .*, 0\}$/);
	bounded('group replayed: the 32 answers again', script => 'group+once', keys => [ @t32, 'tb:1:request' ],
		args => [ $T0, (map { (1, @tb[0 .. 2], 1, $ttl) } 1 .. 32), 604_800_000 ], want => qr/^\{1, .*, 1\}$/);

	# Waits and debts (0.10.0): capacity + max_debt below 2^53, a booking of the whole
	# capacity from an empty bucket (2^52 ms ahead), a settle of the whole debt.
	my $half = 4_503_599_627_370_496;    # 2^52
	my @tbw = ($half, 1, 1, $half - 2, $ttl);
	bounded('token_bucket book: 2^52 - 2 from empty, capacity 2^52, max_debt 2^52 - 2',
		setup => sub { $db->command('SET', 'tb', "0 $T0") }, script => 'token_bucket/book',
		keys => ['tb'], args => [ $T0, @tbw, $half, $half - 2 ], want => qr/^\{1, 0, 0, \d+, ${\($half - 2)}\}$/);
	bounded('token_bucket book made once', setup => sub { $db->command('SET', 'tb', "0 $T0"); $db->command('DEL', 'tb:r') },
		script => 'token_bucket/book+once', keys => [ 'tb', 'tb:r' ],
		args => [ $T0, @tbw, $half, $half - 2, 604_800_000 ], want => qr/^\{1, 0, 0, \d+, ${\($half - 2)}, 0\}$/);
	bounded('token_bucket owe: 2^52 - 2 beyond empty',
		setup => sub { $db->command('SET', 'tb', "0 $T0") }, script => 'token_bucket/owe',
		keys => ['tb'], args => [ $T0, @tbw, $half - 2 ], want => qr/^\{\d+, 0, \d+, \d+\}$/);
	bounded('token_bucket take_one made once: cost = capacity',
		setup => sub { $db->command('DEL', 'tb', 'tb:r') }, script => 'token_bucket/take_one+once',
		keys => [ 'tb', 'tb:r' ], args => [ $T0, @tb, 604_800_000 ], want => qr/^\{1, 0, 0, $cap, 0, 0\}$/);
	bounded('gcra book: a cost of 2^51 past the tolerance', setup => sub { $db->command('DEL', 'g') },
		prepare => sub { $db->command('DEL', 'g') }, script => 'gcra/book', keys => ['g'],
		args => [ $T0, $tol, 512, 1, 2**51, 0, $DAY * 100000, $tol ], want => qr/^\{1, \d+, 0, \d+, \d+\}$/);
	bounded('gcra owe', setup => sub { $db->command('DEL', 'g') }, script => 'gcra/owe', keys => ['g'],
		args => [ $T0, $tol, 512, 1, 2**51, 0, $tol ], want => qr/^\{\d+, \d+, \d+, \d+\}$/);
	bounded('fixed_window book: the next window', setup => sub { $db->command('SET', 'f', $cap); $db->command('DEL', 'f2') },
		script => 'fixed_window/book', keys => [ 'f', 'f2' ],
		args => [ '', @f, $cap, $cap, 3000, 4000, 2000, 0 ], want => qr/^\{1, 0, 0, 1000, 1000\}$/);
	bounded('fixed_window owe', setup => sub { $db->command('SET', 'f', 1) }, script => 'fixed_window/owe',
		keys => ['f'], args => [ '', 1000, 1000, 1000, 2000, 1000 ], want => qr/^\{1000, 0, 1000, 1000\}$/);

	# Regions (0.11.0): a split window's share, a lease of the home region's rest, its deposit.
	bounded('region share: cost = share = 2^53 - 2', setup => sub { $db->command('DEL', 'f', 'f:lease') },
		script => 'region/share_one', keys => [ 'f', 'f:lease' ], args => [ '', $cap, $cap, 1000, 2000 ],
		want => qr/^\{1, 0, 0, 1000, 0, 0\}$/);
	bounded('region share: the share spent, the cost from a lease of 2^53 - 2',
		setup => sub { $db->command('SET', 'f', $cap); $db->command('SET', 'f:lease', "$cap $cap") },
		script => 'region/share_one', keys => [ 'f', 'f:lease' ], args => [ '', $cap, $cap, 1000, 2000 ],
		want => qr/^\{1, 0, 0, 1000, 0, $cap\}$/);
	bounded('region lease: 2^53 - 2 of the rest', setup => sub { $db->command('DEL', 'f') },
		script => 'region/lease_one', keys => ['f'], args => [ '', $cap, 1, 1000, 2000, $cap ],
		want => qr/^\{$cap, 0, 0, 1000\}$/);
	bounded('region deposit: 2^53 - 2 kept', setup => sub { $db->command('DEL', 'f:lease') },
		script => 'region/deposit_one', keys => ['f:lease'], args => [ '', $cap, $cap, 1000 ],
		want => qr/^\{$cap\}$/);
};

# Not a bound, a rule of the same scripts: the first write of a split window's count gives
# the key its TTL, and later writes keep it, so that a server whose clock runs ahead (its
# window ending sooner) never ends the count early, in the region's share or the home's rest.
{
	foreach my $case ([ 'region/share_one', [ 'ttl_share', 'ttl_share:lease' ], [ '', 100, 1, 60000, 61000 ] ],
		[ 'region/lease_one', ['ttl_rest'], [ '', 100, 1, 60000, 61000, 5 ] ])
	{
		my ($script, $keys, $args) = @$case;
		$db->command('DEL', @$keys);
		$db->command('EVALSHA', $sha{$script}, scalar @$keys, @$keys, @$args);
		my @short = @$args;
		@short[ 3, 4 ] = (100, 1100);    # a writer that thinks the window ends in 0.1 s
		$db->command('EVALSHA', $sha{$script}, scalar @$keys, @$keys, @short);
		cmp_ok($db->command('PTTL', $keys->[0]), '>', 50000, "$script: a later write keeps the count's TTL");
	}
}

#
# The sliding log: capacity 10,000, a day's window, full of requests of one token.
#
my ($CAP, $W) = (10_000, $DAY);
# 10,000 takes of 1, one a ms, through the take script itself (one pipeline).
my @fill = $db->pipeline(map {
		[ 'EVALSHA', $sha{'sliding_log/take'}, 1, 'tpl:log', $T0 + $_, $CAP, 1, $W ]
} 0 .. $CAP - 1);
is(scalar(grep { ref $_ eq 'ARRAY' && $_->[0] == 1 } @fill), $CAP, 'a log filled by 10,000 takes of 1');
is($db->command('ZCARD', 'tpl:log'), $CAP, 'a member per request: 10,000');
note('memory of the full log: ' . $db->command('MEMORY', 'USAGE', 'tpl:log', 'SAMPLES', 0) . ' bytes');
# The same tokens as ratelimit 0.8.0 wrote them: a member "<ms>:<n>" per token.
$db->pipeline(map {
		my $t = $T0 + $_;
		[ 'ZADD', 'tpl:old', $t, sprintf('%d:%d', $t, $_ + 1) ]
} 0 .. $CAP - 1);
is($db->command('ZCARD', 'tpl:old'), $CAP, '0.8.0\'s log of the same 10,000 tokens');
note('memory of 0.8.0\'s log: ' . $db->command('MEMORY', 'USAGE', 'tpl:old', 'SAMPLES', 0) . ' bytes');

subtest 'sliding_log at capacity 10,000, full' => sub {
	my $full = copies('tpl:log', 'l');
	my @log = ($CAP, 1, $W);
	my $at = $T0 + $CAP;    # the full log: every take waits for the oldest to leave
	bounded('sliding_log take 1, full: denied (its wait looked up)', setup => $full,
		script => 'sliding_log/take', keys => ['l'], args => [ $at, @log ],
		want => qr/^\{0, 0, ${\($W - $CAP)}, ${\($W - 1)}\}$/);
	bounded('sliding_log take 10,000 (= capacity), full: denied', setup => $full,
		script => 'sliding_log/take', keys => ['l'], args => [ $at, $CAP, $CAP, $W ],
		want => qr/^\{0, 0, ${\($W - 1)}, ${\($W - 1)}\}$/);
	bounded('sliding_log peek 10,000, full', setup => $full, script => 'sliding_log/peek',
		keys => ['l'], args => [ $at, $CAP, $CAP, $W ], want => qr/^\{0, 0, ${\($W - 1)}, /);
	bounded('sliding_log take 1, half of the log expired: granted, trimmed', setup => $full,
		script => 'sliding_log/take', keys => ['l'], args => [ $T0 + $W + 4999, @log ],
		want => qr/^\{1, 4999, 0, $W\}$/);
	bounded('sliding_log take 10,000, all expired: granted', setup => $full,
		script => 'sliding_log/take', keys => ['l'], args => [ $T0 + $W + $CAP, $CAP, $CAP, $W ],
		want => qr/^\{1, 0, 0, $W\}$/);
	bounded('sliding_log take 10,000 made once, all expired: granted',
		setup => sub { $full->(); $db->command('DEL', 'l:r') }, script => 'sliding_log/take+once',
		keys => [ 'l', 'l:r' ], args => [ $T0 + $W + $CAP, $CAP, $CAP, $W, 604_800_000 ],
		want => qr/^\{1, 0, 0, $W, 0, 0\}$/);
	bounded('sliding_log refund 3,333, full', setup => $full, script => 'sliding_log/refund',
		keys => ['l'], args => [ $at, $CAP, 3333, $W ], want => qr/^\{1, 3333, 0, ${\($W - 1)}\}$/);
	bounded('sliding_log refund 10,000, full', setup => $full, script => 'sliding_log/refund',
		keys => ['l'], args => [ $at, $CAP, $CAP, $W ], want => qr/^\{1, $CAP, 0, 0\}$/);
	# After a refund of 3,333 the floor is in force: a take trims under it, a denial's
	# wait searches above it.
	my $refunded = sub {
		$full->();
		$db->command('EVALSHA', $sha{'sliding_log/refund'}, 1, 'l', $at, $CAP, 3333, $W);
	};
	bounded('sliding_log take 3,333 after a refund of 3,333: granted', setup => $refunded,
		script => 'sliding_log/take', keys => ['l'], args => [ $at, $CAP, 3333, $W ],
		want => qr/^\{1, 0, 0, $W\}$/);
	bounded('sliding_log take 3,334 after a refund of 3,333: denied', setup => $refunded,
		script => 'sliding_log/take', keys => ['l'], args => [ $at, $CAP, 3334, $W ],
		want => qr/^\{0, 3333, ${\($W - $CAP + 3333)}, /);
	bounded('reset of the full log', setup => $full, script => 'reset', keys => ['l'],
		args => [], want => qr/^\{1\}$/);
	is($db->command('EXISTS', 'l'), 0, 'the log is gone');

	my @g32 = map { "lg:$_" } 1 .. 32;
	# A denied group writes nothing, and a granted one little (a token and 4 members fewer
	# a log): one copy of the logs for every run.
	bounded('group: 32 full logs, 1 each: denied (32 waits)', prepare => copies('tpl:log', @g32),
		script => 'group', keys => \@g32, args => [ $at, map { (5, @log) } 1 .. 32 ],
		want => qr/^\{0, 0, ${\($W - $CAP)}, ${\($W - 1)}, /);
	bounded('group: 32 full logs, 5,000 each: denied (32 waits)',
		script => 'group', keys => \@g32, args => [ $at, map { (5, $CAP, 5000, $W) } 1 .. 32 ],
		want => qr/^\{0, 0, ${\($W - $CAP + 4999)}, ${\($W - 1)}, /);
	bounded('group: 32 half-expired logs, granted and trimmed',
		script => 'group', keys => \@g32, args => [ $T0 + $W + 4999, map { (5, @log) } 1 .. 32 ],
		want => qr/^\{1, 499\d, 0, $W, /);
};

subtest 'sliding_log: 0.8.0\'s log of 10,000 tokens, converted once' => sub {
	my $old = copies('tpl:old', 'o');
	my $at = $T0 + $CAP;
	bounded('sliding_log take 1 on 0.8.0\'s full log: denied', setup => $old,
		script => 'sliding_log/take', keys => ['o'], args => [ $at, $CAP, 1, $W ],
		want => qr/^\{0, 0, ${\($W - 1)}, ${\($W - 1)}\}$/);
	bounded('sliding_log peek on 0.8.0\'s full log', setup => $old, script => 'sliding_log/peek',
		keys => ['o'], args => [ $at, $CAP, 1, $W ], want => qr/^\{0, 0, /);
	bounded('sliding_log take 1 on 0.8.0\'s log, half expired: converted (UNLINK)', setup => $old,
		script => 'sliding_log/take', keys => ['o'], args => [ $T0 + $W + 4999, $CAP, 1, $W ],
		want => qr/^\{1, 4999, 0, $W\}$/);
	is($db->command('ZCARD', 'o'), 2, 'one member for the 5,000 old tokens in the window, one for the take');
	bounded('sliding_log refund 3,333 on 0.8.0\'s full log: converted', setup => $old,
		script => 'sliding_log/refund', keys => ['o'], args => [ $at, $CAP, 3333, $W ],
		want => qr/^\{1, 3333, 0, ${\($W - 1)}\}$/);
	my @g32 = map { "og:$_" } 1 .. 32;
	bounded('group: 32 of 0.8.0\'s logs, half expired: granted, each converted',
		setup => copies('tpl:old', @g32), script => 'group', keys => \@g32,
		args => [ $T0 + $W + 4999, map { (5, $CAP, 1, $W) } 1 .. 32 ], want => qr/^\{1, 4999, 0, $W, /);
};

#
# Concurrency: 100,000 leases in one set (a transaction may take that many), live or
# expired (a holder that died leaves its leases to expire).
#
subtest 'concurrency: 100,000 leases' => sub {
	my $leases = 100_000;
	for ([ 'tpl:live', $T0 + 3_600_000 ], [ 'tpl:dead', $T0 - 3_600_000 ])
	{
		my ($key, $expiry) = @$_;
		my @ids = map { sprintf('%032x', $_) } 1 .. $leases;
		$db->pipeline(map { [ 'ZADD', $key, map { ($expiry + $_, $ids[$_ - 1]) } $_ .. $_ + 999 ] }
			  grep { $_ % 1000 == 1 } 1 .. $leases);
	}
	is($db->command('ZCARD', 'tpl:dead'), $leases, '100,000 leases');
	my $ttl = 3_600_000;
	# Each run takes back what the last one changed (a lease added or released), or changes
	# too little to matter (32 expired leases fewer).
	bounded('concurrency acquire, 100,000 live', prepare => copies('tpl:live', 'c'),
		setup => sub { $db->command('ZREM', 'c', 'new') },
		script => 'concurrency/acquire', keys => ['c'], args => [ $T0, 2 * $leases, $ttl, 'new' ],
		want => qr/^\{1, ${\($leases - 1)}, 0, /);
	bounded('concurrency acquire, 100,000 expired (trimmed)', prepare => copies('tpl:dead', 'c'),
		setup => sub { $db->command('ZREM', 'c', 'new') },
		script => 'concurrency/acquire', keys => ['c'], args => [ $T0, 2 * $leases, $ttl, 'new' ],
		want => qr/^\{1, ${\(2 * $leases - 1)}, 0, $ttl\}$/);
	bounded('concurrency release, 100,000 live', prepare => copies('tpl:live', 'c'),
		setup => sub { $db->command('ZADD', 'c', $T0 + 3_600_007, sprintf('%032x', 7)) },
		script => 'concurrency/release', keys => ['c'], args => [ $T0, 2 * $leases, $ttl, sprintf('%032x', 7) ],
		want => qr/^\{1, ${\($leases + 1)}, 0, /);
	bounded('concurrency release, 100,000 expired (trimmed)', prepare => copies('tpl:dead', 'c'),
		setup => sub { $db->command('ZADD', 'c', $T0 - 3_599_993, sprintf('%032x', 7)) },
		script => 'concurrency/release', keys => ['c'], args => [ $T0, 2 * $leases, $ttl, sprintf('%032x', 7) ],
		want => qr/^\{0, ${\(2 * $leases)}, 0, 0\}$/);
	bounded('concurrency peek, 100,000 live (all held)', prepare => copies('tpl:live', 'c'),
		script => 'concurrency/peek', keys => ['c'], args => [ $T0, $leases, $ttl, '' ],
		want => qr/^\{0, 0, \d+, \d+\}$/);
	# The queue of waiters (0.10.0): 100,000 tickets waiting, or gone (their waiters died).
	for ([ 'tpl:alive', $T0 + 3_000 ], [ 'tpl:gone', $T0 - 3_000 ])
	{
		my ($key, $expiry) = @$_;
		my @ids = map { sprintf('t%031x', $_) } 1 .. $leases;
		$db->pipeline(map { [ 'ZADD', 'tpl:queue', map { ($T0 - $leases + $_, $ids[$_ - 1]) } $_ .. $_ + 999 ] }
			  grep { $_ % 1000 == 1 } 1 .. $leases) if $key eq 'tpl:alive';
		$db->pipeline(map { [ 'ZADD', $key, map { ($expiry + $_, $ids[$_ - 1]) } $_ .. $_ + 999 ] }
			  grep { $_ % 1000 == 1 } 1 .. $leases);
	}
	my @queue = ('c', 'c:queue', 'c:queue:alive');
	bounded('concurrency acquire, a waiter behind 100,000 waiting',
		prepare => sub { copies('tpl:live', 'c')->(); copies('tpl:queue', 'c:queue')->(); copies('tpl:alive', 'c:queue:alive')->() },
		setup => sub { $db->command('ZREM', 'c:queue', 'new'); $db->command('ZREM', 'c:queue:alive', 'new') },
		script => 'concurrency/acquire', keys => \@queue, args => [ $T0, 2 * $leases, $ttl, 'new', 'new', 3000 ],
		want => qr/^\{0, ${\($leases)}, \d+, \d+\}$/);
	bounded('concurrency acquire, 100,000 waiters gone (32 dropped)',
		prepare => sub { copies('tpl:live', 'c')->(); copies('tpl:queue', 'c:queue')->(); copies('tpl:gone', 'c:queue:alive')->() },
		script => 'concurrency/acquire', keys => \@queue, args => [ $T0, 2 * $leases, $ttl, 'new', 'new', 3000 ],
		want => qr/^\{[01], \d+, \d+, \d+\}$/);
	bounded('concurrency leave, behind 100,000 waiting',
		prepare => sub { copies('tpl:live', 'c')->(); copies('tpl:queue', 'c:queue')->(); copies('tpl:alive', 'c:queue:alive')->() },
		setup => sub { $db->command('ZADD', 'c:queue', $T0, 'new'); $db->command('ZADD', 'c:queue:alive', $T0 + 3000, 'new') },
		script => 'concurrency/leave', keys => \@queue, args => [ $T0, 2 * $leases, $ttl, '', 'new', 3000 ],
		want => qr/^\{1, /);
	bounded('reset of 100,000 leases', setup => copies('tpl:live', 'c'), script => 'reset',
		keys => ['c'], args => [], want => qr/^\{1\}$/);
};

$redis->stop;
done_testing();
