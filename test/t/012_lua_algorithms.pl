#!/usr/bin/perl
#
# Model tests for the scripts of gcra, fixed_window, sliding_window and sliding_log, run
# directly in a private redis-server with an injected clock (ARGV[1] = now in ms): one
# long random (time, cost) sequence per algorithm, with the clock stepping back now and
# then, through its take script and, on a twin key, through the group script
# (rl_consume_all) with one check; every answer is compared with a reference model in
# Perl. For gcra the model is redis-cell's CL.THROTTLE algorithm (limit = capacity)
# transcribed in exact rationals: the answers must be redis-cell's, in milliseconds.
# Hand-worked values, the stored encodings and TTLs, peeks that write nothing, refunds,
# and corrupt state are checked too.
#
# RL_SEED=<n> prove -v test/t/012_lua_algorithms.pl  repeats it with another seed.

use strict;
use warnings;

use FindBin;
use POSIX qw(ceil floor);
use Test::More;
use List::Util qw(min max);

use lib $FindBin::Bin;
use RateLimitTest;

my $redis = redis_start(name => 'algorithms');
my $compose = "$FindBin::Bin/../../dev/lua-script";
my $T0 = 1_800_000_000_000;
my $seed = $ENV{RL_SEED} // 14;
srand($seed);
note("seed $seed");

# One RESP connection for every call (a redis-cli process per call made this file slow).
my $db = $redis->client;

# Loads lua/<name>.lua as the build composes it; returns its SHA1.
my %sha;
sub load_script
{
	my ($name) = @_;
	my $body = `"$compose" "$FindBin::Bin/../../lua/$name.lua"`;
	die "cannot compose $name" if $? != 0;
	my $sha = $db->command('SCRIPT', 'LOAD', $body);
	die "SCRIPT LOAD $name failed: " . (RateLimitTest::RespClient::is_error($sha) ? $sha->msg : $sha)
	  unless !ref $sha && $sha =~ /^[0-9a-f]{40}$/;
	return $sha{$name} = $sha;
}

# One script call: the reply's values (an error: its text).
sub run
{
	my ($name, @args) = @_;
	my $r = $db->command('EVALSHA', $sha{$name}, @args);
	return [ $r->msg ] if RateLimitTest::RespClient::is_error($r);
	return ref $r eq 'ARRAY' ? $r : [$r];
}

sub reply { return '{' . join(', ', @{ $_[0] }) . '}' }

load_script($_) for qw(gcra/take_one gcra/peek gcra/refund fixed_window/take_one fixed_window/take fixed_window/peek
  fixed_window/refund sliding_window/take sliding_window/peek sliding_window/refund
  sliding_log/take sliding_log/peek sliding_log/refund group reset);

sub gcd { my ($a, $b) = @_; ($a, $b) = ($b, $a % $b) while $b; return $a }

#
# GCRA: redis-cell's algorithm, in exact rationals (ms). At amount per period ms every
# time and interval is a whole number of 1/amount ms (the emission interval T is period
# of them), so each is held as that integer: exact, and far quicker than Math::BigRat.
#
sub cell_step
{
	my ($state, $now, $quantity, $limit, $amount, $period) = @_;
	use integer;    # below 2^63 here; a division truncates toward zero
	my $T = $period;
	my $dvt = $T * $limit;
	my $increment = $T * $quantity;
	my $n = $now * $amount;
	my $tat = defined $state->{tat} ? $state->{tat} : $n;
	my $new_tat = ($n > $tat ? $n : $tat) + $increment;
	my $allow_at = $new_tat - $dvt;
	my $diff = $n - $allow_at;
	my ($allowed, $ttl, $retry);
	if ($diff < 0)
	{
		($allowed, $ttl, $retry) = (0, $tat - $n, -$diff);
	}
	else
	{
		($allowed, $ttl, $retry) = (1, $new_tat - $n, 0);
		$state->{tat} = $new_tat;
	}
	my $next = $dvt - $ttl;
	my $remaining = $next > -$T ? $next / $T : 0;
	$remaining = 0 if $remaining < 0;
	$ttl = 0 if $ttl < 0;
	# In ms, rounded up.
	return [ $allowed, $remaining, ($retry + $amount - 1) / $amount, ($ttl + $amount - 1) / $amount ];
}

sub gcra_args
{
	my ($now, $cost, $cap, $amount, $period, $ttl) = @_;
	my $g = gcd($amount, $period);
	my ($unit, $rate) = ($period / $g, $amount / $g);
	return ($now, $cap * $unit, $rate, $unit, $cost, $ttl // 0);
}

subtest 'gcra: hand-worked values (5 per 5 s, capacity 5)' => sub {
	my @a = (5, 1, 1000);
	is(reply(run('gcra/take_one', 1, 'g:hand', gcra_args($T0, 2, @a))), '{1, 3, 0, 2000}', 'take 2: 3 left, TAT 2 s ahead');
	is(reply(run('gcra/take_one', 1, 'g:hand', gcra_args($T0, 4, @a))), '{0, 3, 1000, 2000}', 'take 4: wait 1 s');
	is(reply(run('gcra/peek', 1, 'g:hand', gcra_args($T0 + 1000, 4, @a))), '{1, 4, 0, 1000}', 'a peek 1 s later: 4 would fit');
	is(reply(run('gcra/take_one', 1, 'g:hand', gcra_args($T0 + 1000, 4, @a))), '{1, 0, 0, 5000}', 'and the take does');
	my $value = $db->command('GET', 'g:hand');
	is($value, $T0 + 6000, 'the one number stored: the TAT in units (rate 1: ms)');
	is($db->command('OBJECT', 'ENCODING', 'g:hand'), 'int', 'stored as an integer');
	my $pttl = $db->command('PTTL', 'g:hand');
	ok($pttl > 4000 && $pttl <= 5000, "it lives until the TAT ($pttl ms)");
	is(reply(run('gcra/refund', 1, 'g:hand', gcra_args($T0 + 1000, 3, @a))), '{1, 3, 0, 2000}', 'a refund of 3');
	is(reply(run('gcra/refund', 1, 'g:hand', gcra_args($T0 + 1000, 5, @a))), '{1, 5, 0, 0}', 'never beyond full');
	is($db->command('EXISTS', 'g:hand'), '0', 'a TAT at now is no state at all: deleted');
	$db->command('SET', 'g:bad', 'x1');
	like(reply(run('gcra/take_one', 1, 'g:bad', gcra_args($T0, 1, @a))), qr/corrupt/, 'a corrupt TAT is an error');
};

subtest 'gcra: a long sequence equals redis-cell, through take_one and the group script' => sub {
	for my $p ([ 7, 3, 1000 ], [ 10, 120, 60000 ], [ 1, 1, 250 ], [ 100, 7, 3 ])
	{
		my ($cap, $amount, $period) = @$p;
		my %state;
		my $now = $T0;
		my ($same, $grants, $denials) = (0, 0, 0);
		my $steps = 300;
		for my $i (1 .. $steps)
		{
			$now += int(rand(1.4 * $period / $amount * 2)) - int($period / $amount / 3);
			my $cost = 1 + int(rand($cap));
			my $want = cell_step(\%state, $now, $cost, $cap, $amount, $period);
			# A TTL of an hour: the injected clock runs slower than Redis's own, which expires keys.
			my @args = gcra_args($now, $cost, $cap, $amount, $period, 3_600_000);
			my $one = reply(run('gcra/take_one', 1, "g:seq:$cap", @args));
			my $group = reply(run('group', 1, "g:grp:$cap", $args[0], 2, @args[1 .. 5]));
			$same++ if $one eq reply($want) && $group eq $one;
			diag("step $i at $now cost $cost: take_one $one group $group redis-cell " . reply($want))
			  if $one ne reply($want) || $group ne $one;
			$want->[0] ? $grants++ : $denials++;
		}
		is($same, $steps, "C=$cap, $amount per $period ms: all $steps answers are redis-cell's ($grants grants, $denials denials)");
	}
};

#
# fixed_window: a count per window, PostgreSQL naming the window's key.
#
sub fixed_args
{
	my ($now, $cost, $cap, $w, $prefix, $ttl) = @_;
	my $start = $now - $now % $w;
	my $left = $start + $w - $now;
	return (($prefix // 'f') . ":{s}:w$start", '', $cap, $cost, $left, $ttl // $left + 1000);
}

subtest 'fixed_window: hand-worked values, encoding, TTL, peek, refund' => sub {
	my @k = fixed_args($T0 + 250, 2, 3, 1000);
	is(reply(run('fixed_window/take_one', 1, @k)), '{1, 1, 0, 750}', 'take 2 of 3: 750 ms left in the window');
	is($db->command('OBJECT', 'ENCODING', $k[0]), 'int', 'the count is an integer');
	my $pttl = $db->command('PTTL', $k[0]);
	ok($pttl > 1500 && $pttl <= 1750, "the key outlives the window by a second ($pttl ms)");
	@k = fixed_args($T0 + 500, 2, 3, 1000);
	is(reply(run('fixed_window/take_one', 1, @k)), '{0, 1, 500, 500}', 'take 2 more: denied until the window ends');
	is($db->command('GET', $k[0]), '2', 'a denial leaves the count');
	is(reply(run('fixed_window/peek', 1, @k[0 .. 2], 1, @k[4, 5])), '{1, 1, 0, 500}', 'a peek of 1 would be granted');
	is($db->command('GET', $k[0]), '2', 'and writes nothing');
	is(reply(run('fixed_window/refund', 1, @k[0 .. 2], 5, @k[4, 5])), '{1, 3, 0, 0}', 'a refund never goes below 0');
	is($db->command('EXISTS', $k[0]), '0', 'a count of 0 is no state at all');
	my @n = fixed_args($T0 + 1000, 3, 3, 1000);
	isnt($n[0], $k[0], 'the next window counts in a key of its own');
	is(reply(run('fixed_window/take_one', 1, @n)), '{1, 0, 0, 1000}', 'and starts at 0');
	$db->command('SET', 'f:bad', 'many');
	like(reply(run('fixed_window/take_one', 1, 'f:bad', '', 3, 1, 10, 10)), qr/corrupt/, 'a corrupt count is an error');
	$db->command('HSET', 'f:hash', 'a', 1);
	like(reply(run('fixed_window/take_one', 1, 'f:hash', '', 3, 1, 10, 10)), qr/corrupt/, 'so is another type');
	like(reply(run('fixed_window/take_one', 1, 'f:x', '', 3, 1, 10)), qr/called with 4 arguments, not 5/, 'arguments are counted');
	# At the largest capacity, 2^53 - 2: a denied count passes 2^53, where doubles skip odd numbers.
	my $cap = 9_007_199_254_740_990;
	is(reply(run('fixed_window/take_one', 1, 'f:big', '', $cap, $cap - 1, 1000, 2000)), '{1, 1, 0, 1000}',
		'a take of all but one of 2^53 - 2');
	is(reply(run('fixed_window/take_one', 1, 'f:big', '', $cap, 4, 1000, 2000)), '{0, 1, 1000, 1000}',
		'a take of 4 more: denied, 1 left (exactly)');
	is($db->command('GET', 'f:big'), $cap - 1, 'and the count is as it was');
};

# The count windows of a model: start -> count.
sub window_model
{
	my ($counts, $now, $cost, $cap, $w) = @_;
	my $start = $now - $now % $w;
	my $left = $start + $w - $now;
	my $c = $counts->{$start} // 0;
	if ($c + $cost <= $cap)
	{
		$counts->{$start} = $c + $cost;
		return [ 1, $cap - $c - $cost, 0, $left ];
	}
	return [ 0, $cap - $c, $left, $c > 0 ? $left : 0 ];
}

subtest 'fixed_window: a long sequence equals the model, through take_one and the group script' => sub {
	my (%counts, $same);
	my $now = $T0;
	my $steps = 300;
	for my $i (1 .. $steps)
	{
		$now += int(rand(400)) - 100;
		my $cost = 1 + int(rand(4));
		my $want = reply(window_model(\%counts, $now, $cost, 5, 1000));
		# The keys' TTL runs on Redis's real clock, the model's time is simulated: an hour,
		# so that no key expires while the sequence runs, however slowly.
		my @k = fixed_args($now, $cost, 5, 1000, 'f:seq', 3_600_000);
		my $one = reply(run('fixed_window/take_one', 1, @k));
		my $group = reply(run('group', 1, "g$k[0]", $k[1], 3, @k[2 .. 5]));
		$same++ if $one eq $want && $group eq $one;
		diag("step $i: take_one $one group $group model $want") if $one ne $want || $group ne $one;
	}
	is($same, $steps, "all $steps answers are the model's");
};

# Rollover (0.12.0): the model of windows that carry what the window before left unused, at
# most $roll: start -> [count, carried], carried fixed at a window's first write.
sub rollover_model
{
	my ($windows, $now, $cost, $cap, $roll, $w) = @_;
	my $start = $now - $now % $w;
	my $left = $start + $w - $now;
	my $state = $windows->{$start};
	if (!$state)
	{
		my $prev = $windows->{ $start - $w };
		my $carried = $prev ? min($roll, max($cap + $prev->[1] - $prev->[0], 0)) : $roll;
		$state = [ 0, $carried ];
	}
	my $limit = $cap + $state->[1];
	if ($state->[0] + $cost <= $limit)
	{
		$state->[0] += $cost;
		$windows->{$start} = $state;
		return [ 1, $limit - $state->[0], 0, $left, $limit ];
	}
	return [ 0, max($limit - $state->[0], 0), $left, $state->[0] > 0 ? $left : 0, $limit ];
}

subtest 'fixed_window with rollover: a long sequence equals the model, through take.lua, peek and the group script' => sub {
	my (%windows, $same);
	my $now = $T0;
	my $steps = 300;
	for my $i (1 .. $steps)
	{
		# Some windows used up, some idle (a jump of several windows), some half used.
		$now += int(rand(700)) - 100 + (rand() < 0.1 ? 3000 : 0);
		my $cost = 1 + int(rand(4));
		my $start = $now - $now % 1000;
		my @k = ("r:seq:w$start", 'r:seq:w' . ($start - 1000));
		my @args = ('', 6, $cost, $start + 1000 - $now, 3_600_000, 4);
		my $peek = reply(run('fixed_window/peek', 2, @k, @args));
		my $want = rollover_model(\%windows, $now, $cost, 6, 4, 1000);
		my $one = reply(run('fixed_window/take', 2, @k, @args));
		my $group = reply(run('group', 2, map({"g$_"} @k), '', 6, @args[1 .. 5]));
		my $ok = $one eq reply($want) && $group eq reply([ @{$want}[ 0 .. 3 ] ]);
		# A peek (before the take) answers what the take will, against the same limit.
		$ok &&= $peek =~ /^\{$want->[0], \d+, \d+, \d+, $want->[4]\}$/;
		$same++ if $ok;
		diag("step $i: take $one group $group peek $peek model " . reply($want)) unless $ok;
	}
	is($same, $steps, "all $steps answers are the model's");
};

#
# sliding_window: the previous window weighted by its overlap (Cloudflare's counter).
#
sub sliding_args
{
	my ($now, $cost, $cap, $w, $prefix) = @_;
	my $start = $now - $now % $w;
	my $elapsed = $now - $start;
	my $left = $w - $elapsed;
	return (2, "$prefix:w$start", "$prefix:w" . ($start - $w), '', $cap, $cost, $w, $elapsed);
}

sub sliding_model
{
	my ($counts, $now, $cost, $cap, $w) = @_;
	my $start = $now - $now % $w;
	my ($e, $left) = ($now - $start, $w - ($now - $start));
	my $cur = $counts->{$start} // 0;
	my $prev = $counts->{ $start - $w } // 0;
	my ($allowed, $retry) = (0, 0);
	if ($prev * ($w - $e) + ($cur + $cost) * $w <= $cap * $w)
	{
		$allowed = 1;
		$cur += $cost;
		$counts->{$start} = $cur;
	}
	elsif ($cap - $cur - $cost >= 0)
	{
		$retry = $w - floor(($cap - $cur - $cost) * $w / $prev) - $e;
	}
	else
	{
		$retry = $left + $w - floor(($cap - $cost) * $w / $cur);
	}
	my $used = $prev * ($w - $e) + $cur * $w;
	my $remaining = $used >= $cap * $w ? 0 : floor(($cap * $w - $used) / $w);
	my $reset = $cur > 0 ? $left + $w : $prev > 0 ? $left : 0;
	return [ $allowed, $remaining, $retry, $reset ];
}

subtest 'sliding_window: hand-worked values' => sub {
	# 4 per 10 s: 4 taken 2 s into a window; 5 s into the next they weigh 2.
	is(reply(run('sliding_window/take', sliding_args($T0 + 2000, 4, 4, 10000, 's:h'))),
		'{1, 0, 0, 18000}', 'take 4: none left, weighing until the next window ends');
	is(reply(run('sliding_window/take', sliding_args($T0 + 15000, 3, 4, 10000, 's:h'))),
		'{0, 2, 2500, 5000}', 'take 3, 5 s into the next: 2 fit now, 3 once the 4 weigh 1 (2.5 s); all gone in 5 s');
	is(reply(run('sliding_window/take', sliding_args($T0 + 15000, 2, 4, 10000, 's:h'))),
		'{1, 0, 0, 15000}', 'take 2: granted');
	is(reply(run('sliding_window/peek', sliding_args($T0 + 17500, 1, 4, 10000, 's:h'))),
		'{1, 1, 0, 12500}', 'a peek 2.5 s later: one more would fit');
};

subtest 'sliding_window: a long sequence equals the model, through take and the group script' => sub {
	my (%counts, $same);
	my $now = $T0;
	my $steps = 300;
	for my $i (1 .. $steps)
	{
		$now += int(rand(3000)) - 300;
		my $cost = 1 + int(rand(5));
		my $want = reply(sliding_model(\%counts, $now, $cost, 8, 5000));
		my @k = sliding_args($now, $cost, 8, 5000, 's:seq');
		my $one = reply(run('sliding_window/take', @k));
		my @g = sliding_args($now, $cost, 8, 5000, 's:grp');
		my $group = reply(run('group', 2, @g[1, 2], $g[3], 4, @g[4 .. 7]));
		$same++ if $one eq $want && $group eq $one;
		diag("step $i: take $one group $group model $want") if $one ne $want || $group ne $one;
	}
	is($same, $steps, "all $steps answers are the model's");
};

# The most grants in any span of one window's length, from a list of grant times.
sub worst_span
{
	my ($times, $w) = @_;
	my @t = sort { $a <=> $b } @$times;
	my ($worst, $j) = (0, 0);
	for my $i (0 .. $#t)
	{
		$j++ while $t[$i] - $t[$j] >= $w;
		$worst = $i - $j + 1 if $i - $j + 1 > $worst;
	}
	return $worst;
}

subtest 'sliding_window: its error, measured (docs/algorithms.md)' => sub {
	my ($cap, $w) = (100, 10_000);
	# Adversarial, through the script: every 100 ms, take one token at a time until denied.
	my @granted;
	for (my $now = $T0 + 5000; $now < $T0 + 45_000; $now += 100)
	{
		while (1)
		{
			my $r = run('sliding_window/take', sliding_args($now, 1, $cap, $w, 's:adv'));
			last unless $r->[0] eq '1';
			push @granted, $now;
		}
	}
	my $adversarial = worst_span(\@granted, $w);
	# Random, through the model: Poisson-like arrivals at twice the rate the limit allows.
	my (%counts, @random);
	my $now = $T0;
	for (1 .. 20_000)
	{
		$now += int(rand(2 * $w / $cap));
		push @random, $now if sliding_model(\%counts, $now, 1, $cap, $w)->[0];
	}
	my $spread = worst_span(\@random, $w);
	note(sprintf('sliding_window, capacity %d per %d ms: worst span of one window %d grants (%.2f x capacity) '
		  . 'when every 100 ms takes all it may; %d (%.2f x) for random arrivals at twice the rate',
		  $cap, $w, $adversarial, $adversarial / $cap, $spread, $spread / $cap));
	cmp_ok($adversarial, '>', $cap, 'an adversary gets more than the capacity into some window: the counter approximates');
	cmp_ok($adversarial, '<=', 2 * $cap, 'but never more than twice the capacity');
	cmp_ok($spread, '<=', 2 * $cap, 'random traffic: at most twice the capacity too');
};

#
# sliding_log: exact, a member per request carrying the tokens granted up to it.
#
# The model keeps a time per token, oldest first: a request's tokens are stamped now, or
# the newest token's time if later (a clock that stepped back), so they leave the window
# after every token before them.
sub log_model
{
	my ($log, $now, $cost, $cap, $w, $peek) = @_;
	my @in = grep { $_ > $now - $w } @$log;
	my ($allowed, $retry) = (0, 0);
	if (@in + $cost <= $cap)
	{
		$allowed = 1;
		return [ 1, $cap - @in, 0, @in ? $in[-1] + $w - $now : 0 ] if $peek;
		my $at = @in && $in[-1] > $now ? $in[-1] : $now;
		push @in, ($at) x $cost;
		@$log = @in;
	}
	else
	{
		$retry = $in[ @in + $cost - $cap - 1 ] + $w - $now;
	}
	my $reset = @in ? $in[-1] + $w - $now : 0;
	return [ $allowed, $cap - @in > 0 ? $cap - @in : 0, $retry, $reset ];
}

subtest 'sliding_log: hand-worked values, members, TTL, peek, refund' => sub {
	is(reply(run('sliding_log/take', 1, 'l:h', $T0, 3, 2, 10000)), '{1, 1, 0, 10000}', 'take 2 of 3');
	is(reply(run('sliding_log/take', 1, 'l:h', $T0 + 4000, 3, 1, 10000)), '{1, 0, 0, 10000}', 'take 1 4 s later');
	is(reply(run('sliding_log/take', 1, 'l:h', $T0 + 4000, 3, 1, 10000)), '{0, 0, 6000, 10000}',
		'one more: when the first leaves the window');
	is($db->command('ZCARD', 'l:h'), '2', 'a member per request');
	is(reply(run('sliding_log/peek', 1, 'l:h', $T0 + 10000, 3, 3, 10000)), '{0, 2, 4000, 4000}',
		'at 10 s two have left: 3 would wait 4 s more');
	is(reply(run('sliding_log/refund', 1, 'l:h', $T0 + 10000, 3, 1, 10000)), '{1, 3, 0, 0}',
		'a refund takes out the oldest in the window');
	is($db->command('EXISTS', 'l:h'), '0', 'a log that counts nothing is no state at all');
	run('sliding_log/take', 1, 'l:h', $T0 + 10000, 3, 3, 10000);
	my $pttl = $db->command('PTTL', 'l:h');
	ok($pttl > 9000 && $pttl <= 10000, "the log lives a window after its last write ($pttl ms)");
};

subtest 'sliding_log: a long sequence equals the model, through take and the group script' => sub {
	my (@log, $same);
	my $now = $T0;
	my $steps = 300;
	for my $i (1 .. $steps)
	{
		$now += int(rand(900)) - 150;
		my $cost = 1 + int(rand(3));
		my $want = reply(log_model(\@log, $now, $cost, 6, 3000));
		my $one = reply(run('sliding_log/take', 1, 'l:seq', $now, 6, $cost, 3000));
		my $group = reply(run('group', 1, 'l:grp', $now, 5, 6, $cost, 3000));
		$same++ if $one eq $want && $group eq $one;
		diag("step $i at $now cost $cost: take $one group $group model $want") if $one ne $want || $group ne $one;
	}
	is($same, $steps, "all $steps answers are the model's");
	cmp_ok($db->command('ZCARD', 'l:seq'), '<=', 6 + 6, 'the log holds no more than its window needs');
};

# The same calls with the keys apart: the reply as '{a, b, c, d}', an error as its text.
sub fast
{
	my ($name, $keys, @args) = @_;
	my $r = $db->command('EVALSHA', $sha{$name}, scalar(@$keys), @$keys, @args);
	return RateLimitTest::RespClient::is_error($r) ? $r->msg : reply($r);
}

# A refund in the model: the oldest tokens in the window go.
sub log_refund_model
{
	my ($log, $now, $cost, $cap, $w) = @_;
	my @in = grep { $_ > $now - $w } @$log;
	splice(@in, 0, $cost < @in ? $cost : scalar(@in));
	@$log = @in;
	return [ 1, $cap - @in, 0, @in ? $in[-1] + $w - $now : 0 ];
}

subtest 'sliding_log: takes, peeks and refunds equal the model, the clock stepping back' => sub {
	my (@log, %same);
	my ($cap, $w) = (6, 3000);
	my $now = $T0 + 100_000;
	my $steps = 600;
	my %count;
	for my $i (1 .. $steps)
	{
		$now += int(rand(700)) - 150;
		my $cost = 1 + int(rand(3));
		my $op = (qw(take take take peek refund))[ int(rand(5)) ];
		$count{$op}++;
		my ($want, $got);
		if ($op eq 'refund')
		{
			$want = reply(log_refund_model(\@log, $now, $cost, $cap, $w));
			$got = fast('sliding_log/refund', ['l:mix'], $now, $cap, $cost, $w);
		}
		else
		{
			$want = reply(log_model(\@log, $now, $cost, $cap, $w, $op eq 'peek'));
			$got = fast("sliding_log/$op", ['l:mix'], $now, $cap, $cost, $w);
		}
		$same{$op}++ if $got eq $want;
		diag("step $i at $now: $op $cost: $got, model $want") if $got ne $want;
	}
	is($same{$_} // 0, $count{$_}, "$count{$_} ${_}s: every answer is the model's") for sort keys %count;
};

subtest 'sliding_log: a clock stepping back stamps new requests at the newest time' => sub {
	is(fast('sliding_log/take', ['l:back'], $T0 + 5000, 3, 2, 10000), '{1, 1, 0, 10000}', 'take 2 at 5 s');
	is(fast('sliding_log/take', ['l:back'], $T0, 3, 1, 10000), '{1, 0, 0, 15000}',
		'the clock steps back 5 s: take 1, stamped at 5 s (it leaves the window with the others)');
	is_deeply($db->command('ZRANGE', 'l:back', 0, -1, 'WITHSCORES'),
		[ '0000000000000002/2', $T0 + 5000, '0000000000000003/1', $T0 + 5000 ],
		'a member per request: the tokens granted up to it, its cost; both at 5 s');
	is(fast('sliding_log/take', ['l:back'], $T0 + 14_999, 3, 1, 10000), '{0, 0, 1, 1}',
		'at 14.999 s the log is full: 1 ms to wait');
	is(fast('sliding_log/take', ['l:back'], $T0 + 15_000, 3, 3, 10000), '{1, 0, 0, 10000}',
		'at 15 s every token has left: 3 granted');
};

subtest 'sliding_log: two checks of one log in the group script' => sub {
	is(fast('group', [ 'l:two', 'l:two' ], $T0, 5, 5, 2, 10000, 5, 5, 2, 10000),
		'{1, 1, 0, 10000, 1, 1, 0, 10000}', '2 and 2 of 5 granted together');
	is(fast('group', [ 'l:two', 'l:two' ], $T0 + 1000, 5, 5, 1, 10000, 5, 5, 2, 10000),
		'{0, 1, 0, 9000, 0, 1, 9000, 9000}',
		'1 and 2 more: the second would wait for 2 of the oldest (9 s); nothing charged');
	is($db->command('ZCARD', 'l:two'), 1, 'one member for the two checks granted together');
};

subtest 'sliding_log: a log that 0.8.0 wrote (a member per token) is read conservatively' => sub {
	my ($cap, $w) = (10, 10000);
	# 0.8.0's members: "<ms>:<n>", scored by ms: 3 tokens at 0 s, 4 at 2 s.
	my $old = sub {
		my ($key) = @_;
		$db->command('DEL', $key);
		$db->command('ZADD', $key, map { ($T0, "$T0:$_") } 1 .. 3);
		$db->command('ZADD', $key, map { ($T0 + 2000, ($T0 + 2000) . ":$_") } 4 .. 7);
	};
	$old->('l:old');
	is(fast('sliding_log/peek', ['l:old'], $T0 + 5000, $cap, 3, $w), '{1, 3, 0, 7000}',
		'7 tokens counted: 3 more fit');
	is(fast('sliding_log/peek', ['l:old'], $T0 + 5000, $cap, 4, $w), '{0, 3, 7000, 7000}',
		'4 would wait until 12 s, when all 7 have left (0.8.0 said 10 s, when the 3 oldest had): never sooner');
	is($db->command('ZCARD', 'l:old'), 7, 'a peek writes nothing: still 0.8.0\'s log');
	is(fast('sliding_log/take', ['l:old'], $T0 + 5000, $cap, 2, $w), '{1, 1, 0, 10000}', 'take 2: granted');
	is_deeply($db->command('ZRANGE', 'l:old', 0, -1, 'WITHSCORES'),
		[ '0000000000000007/7', $T0 + 2000, '0000000000000009/2', $T0 + 5000 ],
		'written anew: one request at the newest old time holding the 7, then the 2');
	is(fast('sliding_log/take', ['l:old'], $T0 + 11_999, $cap, 2, $w), '{0, 1, 1, 3001}',
		'at 11.999 s the 7 still count (0.8.0 would have let its 3 oldest go and granted): denied');
	is(fast('sliding_log/take', ['l:old'], $T0 + 12_000, $cap, 8, $w), '{1, 0, 0, 10000}', 'at 12 s they are gone');

	$old->('l:old');
	is(fast('sliding_log/refund', ['l:old'], $T0 + 5000, $cap, 3, $w), '{1, 6, 0, 7000}',
		'a refund of 3 on 0.8.0\'s log: the 3 oldest go');
	is_deeply($db->command('ZRANGE', 'l:old', 0, -1, 'WITHSCORES'), [ '0000000000000007/7/3', $T0 + 2000 ],
		'one member holding the 7, 3 of them under the floor');
	is(fast('sliding_log/peek', ['l:old'], $T0 + 5000, $cap, 4, $w), '{1, 6, 0, 7000}', 'and 4 fit');

	$old->('l:old');
	is(fast('group', ['l:old'], $T0 + 5000, 5, $cap, 4, $w), '{0, 3, 7000, 7000}', 'the group script reads it too');
	is(fast('sliding_log/take', ['l:old'], $T0 + 12_000, $cap, 10, $w), '{1, 0, 0, 10000}',
		'once all of it has left the window, a take of the capacity');
	is($db->command('ZCARD', 'l:old'), 1, 'the old members are gone');
};

subtest 'sliding_log: costs up to a capacity of 10,000, exact' => sub {
	my ($cap, $w) = (10_000, 86_400_000);
	my @granted = map { fast('sliding_log/take', ['l:big'], $T0 + $_, $cap, 5000, $w) } 1 .. 10;
	is(scalar(grep { /^\{1,/ } @granted), 2, 'ten takes of 5,000 on 10,000 a day: exactly 2 granted');
	is($granted[2], '{0, 0, 86399998, 86399999}', 'the third waits until the first leaves the window');
	is($db->command('ZCARD', 'l:big'), 2, 'a member per request');
	is(fast('sliding_log/take', ['l:cap'], $T0, $cap, $cap, $w), '{1, 0, 0, 86400000}', 'a cost of the capacity');
	is(fast('sliding_log/refund', ['l:cap'], $T0 + 1, $cap, 3333, $w), '{1, 3333, 0, 86399999}', 'a refund of 3,333');
	is(fast('sliding_log/take', ['l:cap'], $T0 + 2, $cap, 3334, $w), '{0, 3333, 86399998, 86399998}',
		'3,334 more: the rest of the first request must leave');
	is(fast('sliding_log/take', ['l:cap'], $T0 + 2, $cap, 3333, $w), '{1, 0, 0, 86400000}', '3,333 fit');
};

subtest 'sliding_log: a Redis user with the commands 0.8.0 needed (no UNLINK) runs every script' => sub {
	$db->command('ACL', 'SETUSER', 'old_acl', 'on', '>pw-012', '~*', '-@all',
		map { "+$_" } qw(evalsha eval time get set hmget del pexpire zcount zscore zrem
		  zremrangebyscore zadd zrange zrangebyscore zrevrangebyscore));
	my $user = RateLimitTest::RespClient->new(port => $redis->port, user => 'old_acl', password => 'pw-012');
	my $as_user = sub {
		my ($name, $keys, @args) = @_;
		my $r = $user->command('EVALSHA', $sha{$name}, scalar(@$keys), @$keys, @args);
		return RateLimitTest::RespClient::is_error($r) ? $r->msg : reply($r);
	};
	is($as_user->('sliding_log/take', ['l:acl'], $T0, 5, 2, 10000), '{1, 3, 0, 10000}', 'a take');
	is($as_user->('sliding_log/peek', ['l:acl'], $T0, 5, 4, 10000), '{0, 3, 10000, 10000}', 'a peek');
	is($as_user->('group', ['l:acl'], $T0, 5, 5, 1, 10000), '{1, 2, 0, 10000}', 'a check of the group');
	is($as_user->('sliding_log/refund', ['l:acl'], $T0, 5, 5, 10000), '{1, 5, 0, 0}',
		'a refund of all it holds: the log is deleted (DEL)');
	is($db->command('EXISTS', 'l:acl'), 0, 'it is gone');
	$db->command('ZADD', 'l:acl', map { ($T0, "$T0:$_") } 1 .. 3);
	is($as_user->('sliding_log/take', ['l:acl'], $T0 + 1, 5, 1, 10000), '{1, 1, 0, 10000}',
		'0.8.0\'s log converted on its first write (DEL)');
	is($as_user->('reset', ['l:acl']), '{1}', 'rl_reset (DEL)');
	$user->close;
	$db->command('ACL', 'DELUSER', 'old_acl');
};

subtest 'peeks are marked no-writes: EVALSHA_RO runs them (replicas may too)' => sub {
	my $ro = sub {
		my ($name, @args) = @_;
		my $r = $db->command('EVALSHA_RO', $sha{$name}, @args);
		return RateLimitTest::RespClient::is_error($r) ? $r->msg : reply($r);
	};
	is($ro->('gcra/peek', 1, 'ro:g', gcra_args($T0, 2, 5, 1, 1000)), '{1, 5, 0, 0}', 'gcra');
	my @f = fixed_args($T0, 2, 3, 1000, 'ro:f');
	is($ro->('fixed_window/peek', 1, @f), '{1, 3, 0, 0}', 'fixed_window');
	is($ro->('sliding_window/peek', sliding_args($T0, 1, 4, 1000, 'ro:s')), '{1, 4, 0, 0}', 'sliding_window');
	is($ro->('sliding_log/peek', 1, 'ro:l', $T0, 3, 1, 1000), '{1, 3, 0, 0}', 'sliding_log');
	like($ro->('gcra/take_one', 1, 'ro:g', gcra_args($T0, 2, 5, 1, 1000)), qr/not allowed|read.only|readonly/i,
		'a take, which writes, is refused there');
};

subtest 'the group script: mixed algorithms, all or none' => sub {
	my @f = fixed_args($T0, 2, 2, 60000);
	my @s = sliding_args($T0, 1, 5, 60000, 'mix:s');
	my @args = ($T0, 2, (gcra_args($T0, 1, 5, 1, 1000))[1 .. 5], 3, @f[2 .. 5], 4, @s[4 .. 7], 5, 3, 1, 60000);
	my $keys = [ 'mix:g', $f[0], @s[1, 2], 'mix:l' ];
	is(reply(run('group', 5, @$keys, @args)), '{1, 4, 0, 1000, 1, 0, 0, 60000, 1, 4, 0, 120000, 1, 2, 0, 60000}',
		'four algorithms granted together');
	is(reply(run('group', 5, @$keys, @args)),
		'{0, 4, 0, 1000, 0, 0, 60000, 60000, 0, 4, 0, 120000, 0, 2, 0, 60000}',
		'the fixed window is spent: nothing is charged, its wait is said');
	is($db->command('ZCARD', 'mix:l'), '1', 'the log kept one member');
	like(reply(run('group', 1, 'mix:x', $T0, 9, 1, 2, 3)), qr/do not match its keys/, 'an unknown tag is refused');
};

$redis->stop;
done_testing();
