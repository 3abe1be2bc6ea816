#!/usr/bin/perl
#
# Model tests for lua/token_bucket/take_one.lua (rl_consume's take of a token bucket,
# composed with lua/lib.lua), run directly in a private redis-server with an injected
# clock (ARGV[1] = now in ms). test/t/011_lua_model_group.pl runs them all again against
# lua/group.lua (rl_consume_all), one token-bucket check per call, which must answer alike.
#
# Every call is checked twice: against exact values worked out by hand, and against a
# pure-Perl reference model of the same math in 64-bit integers (model_step below). The
# model starts from the state actually stored in Redis before the call, and the state the
# script leaves behind (level, time, expiry) is compared with the model too.
#
# Redis is spoken to over a socket in RESP, so replies keep their type (an error reply is
# never mistaken for data) and each step's commands travel in one round trip. One check
# also runs the script the plain way, `redis-cli EVAL "$(cat script)" 1 key ARGV...`.
#
# Stored numbers that are not whole, finite and below 2^53 are corrupt state (an error
# reply); sums with a clock pause saturate at 2^53 - 1 instead of losing precision.
#
# RL_SEED=<n> prove -v test/t/010_lua_model.pl  repeats the randomized part with another seed.

use strict;
use warnings;

use Digest::SHA qw(sha1_hex);
use File::Temp qw(tempdir);
use FindBin;
use IO::Socket::INET;
use Math::BigFloat;
use POSIX qw(WNOHANG _exit);
use Test::More;
use Time::HiRes ();

# The take script as Redis runs it: dev/lua-script puts lua/lib.lua and the algorithm's
# common.lua before it, as the build does.
my $SCRIPT_NAME = $ENV{RL_TAKE_SCRIPT} // 'token_bucket/take_one.lua';
my $SCRIPT_PATH = "$FindBin::Bin/../../lua/$SCRIPT_NAME";
# The group script takes each check's algorithm tag before its numbers (1: token bucket).
my @TAG = $SCRIPT_NAME eq 'group.lua' ? (1) : ();
my $COMPOSE = "$FindBin::Bin/../../dev/lua-script";
my $LIMIT = 1 << 53;    # every value of the bucket math stays below this (as in algorithm/token_bucket.h)
my $T0 = 1_800_000_000_000;    # an injected "now" around 2027, as Redis TIME gives in ms

for my $bin (qw(redis-server redis-cli))
{
	plan skip_all => "$bin is not installed"
	  unless grep { -x "$_/$bin" } split /:/, ($ENV{PATH} // '');
}

# A hung Redis must not hang the test: die, and let END stop the server.
$SIG{ALRM} = sub { die "timed out waiting for redis-server\n" };
alarm 120;
# A signal (^C, a closed output pipe) must also run END and stop the server.
$SIG{$_} = sub { die "caught SIG$_[0]\n" } for qw(INT TERM HUP PIPE);

#
# A private redis-server, stopped in END even when the test dies.
#
my $tmpdir = tempdir('rl_lua_model_XXXXXX', TMPDIR => 1, CLEANUP => 1);
my ($redis_pid, $port, $sock);

END
{
	local $?;    # keep the test's exit status
	if ($redis_pid)
	{
		kill 'TERM', $redis_pid;
		my $deadline = Time::HiRes::time() + 5;
		while (waitpid($redis_pid, WNOHANG) == 0)
		{
			if (Time::HiRes::time() > $deadline)
			{
				kill 'KILL', $redis_pid;
				waitpid($redis_pid, 0);
				last;
			}
			Time::HiRes::sleep(0.02);
		}
		$redis_pid = undef;
	}
}

sub free_port
{
	my $s = IO::Socket::INET->new(
		Listen => 1,
		LocalAddr => '127.0.0.1',
		LocalPort => 0,
		Proto => 'tcp') or die "cannot find a free port: $!";
	my $p = $s->sockport;
	close $s;
	return $p;
}

sub start_redis
{
	for my $attempt (1 .. 5)
	{
		$port = free_port();
		my $pid = fork();
		die "fork: $!" unless defined $pid;
		if ($pid == 0)
		{
			open STDOUT, '>', "$tmpdir/redis.out";
			open STDERR, '>&', \*STDOUT;
			no warnings 'exec';
			exec 'redis-server', '--port', $port, '--bind', '127.0.0.1',
			  '--save', '', '--appendonly', 'no', '--dir', $tmpdir,
			  '--logfile', "$tmpdir/redis.log", '--daemonize', 'no';
			_exit(127);
		}
		$redis_pid = $pid;
		my $deadline = Time::HiRes::time() + 10;
		while (Time::HiRes::time() < $deadline)
		{
			if (waitpid($pid, WNOHANG) == $pid)
			{
				$redis_pid = undef;    # exited: port taken? try another one
				last;
			}
			$sock = IO::Socket::INET->new(
				PeerAddr => '127.0.0.1',
				PeerPort => $port,
				Proto => 'tcp');
			if ($sock)
			{
				binmode $sock;
				my $pong = eval { cmd('PING') };
				return if defined $pong && !ref $pong && $pong eq 'PONG';
				close $sock;
				$sock = undef;
			}
			Time::HiRes::sleep(0.05);
		}
		if ($redis_pid)
		{
			kill 'KILL', $redis_pid;
			waitpid($redis_pid, 0);
			$redis_pid = undef;
		}
	}
	my $log = -e "$tmpdir/redis.log" ? `cat $tmpdir/redis.log` : '';
	die "redis-server did not start\n$log";
}

#
# A minimal RESP client: typed replies, pipelined commands.
# Error replies come back as RedisError objects; nil as undef.
#
package RedisError
{
	sub new { my ($class, $msg) = @_; return bless { msg => $msg }, $class }
	sub msg { return $_[0]{msg} }
}

sub encode_command
{
	my @args = @_;
	my $out = '*' . scalar(@args) . "\r\n";
	for my $a (@args)
	{
		die "undefined argument" unless defined $a;
		$out .= '$' . length($a) . "\r\n" . $a . "\r\n";
	}
	return $out;
}

sub read_reply
{
	my $line = readline($sock);
	die "connection to redis closed" unless defined $line;
	$line =~ s/\r\n\z// or die "malformed reply line: $line";
	my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
	return $rest if $type eq '+';
	return RedisError->new($rest) if $type eq '-';
	return 0 + $rest if $type eq ':';
	if ($type eq '$')
	{
		return undef if $rest == -1;
		my $data = '';
		while (length($data) < $rest + 2)
		{
			my $n = read($sock, $data, $rest + 2 - length($data), length($data));
			die "connection to redis closed" unless $n;
		}
		return substr($data, 0, $rest);
	}
	if ($type eq '*')
	{
		return undef if $rest == -1;
		return [ map { read_reply() } 1 .. $rest ];
	}
	die "unknown reply type: $line";
}

# pipeline([cmd, args...], [cmd, args...], ...): one write, then every reply in order.
sub pipeline
{
	my @cmds = @_;
	my $out = join '', map { encode_command(@$_) } @cmds;
	print {$sock} $out or die "write to redis: $!";
	$sock->flush;
	return map { read_reply() } @cmds;
}

sub cmd { my ($r) = pipeline([@_]); return $r }

# A bucket's stored (level, time), as the script reads it: the string "<level> <time>"
# it writes, or the hash of ratelimit 0.3; (nil, nil) for a missing key.
my $READ_STATE = q{
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  return redis.call('HMGET', KEYS[1], 'level', 'time')
elseif kind == 'string' then
  local value = redis.call('GET', KEYS[1])
  local level, last = string.match(value, '^(%S*) (%S*)$')
  if level == nil then
    return {value, false}
  end
  return {level, last}
end
return {false, false}
};

sub read_state_command { return [ 'EVAL', $READ_STATE, 1, $_[0] ] }

sub is_error { return ref $_[0] eq 'RedisError' }

#
# Policies: (capacity C, refill_amount R per period P ms) -> the script's parameters,
# exactly as bucket_params_init() in src/algorithm/token_bucket.c computes them. Returns undef when the
# policy is outside the exact bounds (C*unit + rate must stay below 2^53).
#
sub gcd
{
	my ($a, $b) = @_;
	($a, $b) = ($b, $a % $b) while $b;
	return $a;
}

sub policy
{
	my ($C, $R, $P, %opt) = @_;
	use integer;
	return undef if $C <= 0 || $R <= 0 || $P <= 0;
	my $g = gcd($R, $P);
	my $unit = $P / $g;
	my $rate = $R / $g;
	return undef if $rate >= $LIMIT;
	# C*unit < 2^53 - rate, without overflowing 64 bits
	return undef if $C > ($LIMIT - $rate - 1) / $unit;
	my $cap = $C * $unit;
	my $refill_ms = ($cap + $rate - 1) / $rate;
	my $ttl = $opt{ttl} // $refill_ms;
	return undef if $ttl < $refill_ms;
	return {
		C => $C, R => $R, P => $P,
		unit => $unit, rate => $rate, cap => $cap,
		refill_ms => $refill_ms, ttl => $ttl,
		name => "C=$C R=$R P=$P",
	};
}

# ARGV[1..6] of the script for a policy, a cost in tokens and an injected now (undef: ''):
# the clock, then the bucket's capacity units, rate, unit, cost and TTL.
sub script_args
{
	my ($p, $cost, $now) = @_;
	return ($now // '', @TAG, $p->{cap}, $p->{rate}, $p->{unit}, $cost, $p->{ttl});
}

#
# The reference model, in exact 64-bit integers. State is [level units, time ms] or undef
# (no key: a full bucket). Returns (reply, state after, expiry set in ms or undef).
#
sub ceil_div
{
	use integer;
	my ($a, $b) = @_;
	return ($a + $b - 1) / $b;
}

sub model_step
{
	my ($p, $state, $cost, $now) = @_;
	use integer;
	my ($cap, $rate, $unit) = @{$p}{qw(cap rate unit)};
	my $need = $cost * $unit;
	my ($level, $time) = $state ? @$state : ($cap, $now);
	$level = $cap if $level > $cap;    # a bucket never holds more than its capacity

	# Refill for the time since the last write; a clock that went back adds nothing and
	# the stored time never moves back. level = min(cap, level + elapsed * rate), with the
	# product only formed when it cannot pass cap (so it cannot overflow).
	if ($now > $time)
	{
		my $elapsed = $now - $time;
		$level = $elapsed > ($cap - $level) / $rate ? $cap : $level + $elapsed * $rate;
		$time = $now;
	}
	my $paused = $time - $now;    # >= 0: how far the clock is behind the stored time
	# Sums with the pause saturate at 2^53 - 1, the largest exact double.
	my $add = sub { my $sum = $_[0] + $_[1]; $sum > $LIMIT - 1 ? $LIMIT - 1 : $sum };

	if ($level >= $need)
	{
		$level -= $need;
		my $reset = $level < $cap ? $add->($paused, ceil_div($cap - $level, $rate)) : 0;
		return ([ 1, $level / $unit, 0, $reset ], [ $level, $time ], $add->($p->{ttl}, $paused));
	}
	my $retry = $add->($paused, ceil_div($need - $level, $rate));
	my $reset = $level < $cap ? $add->($paused, ceil_div($cap - $level, $rate)) : 0;
	return ([ 0, $level / $unit, $retry, $reset ], $state, undef);
}

# A stored number as an exact integer (Lua may write exponent notation), undef if not one.
sub stored_int
{
	my ($s) = @_;
	return undef unless defined $s;
	return 0 + $s if $s =~ /\A-?[0-9]{1,18}\z/;
	return undef unless $s =~ /\A[-+]?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?\z/;
	my $f = Math::BigFloat->new($s);
	return undef unless $f->is_int && $f->babs->blt($LIMIT * 4);
	return 0 + $f->as_int->bstr;
}

sub raw_state_string
{
	my ($hm) = @_;
	return 'error' if is_error($hm);
	return '(' . join(', ', map { defined $_ ? "'$_'" : 'nil' } @$hm) . ')';
}

sub reply_string
{
	my ($r) = @_;
	return 'error reply: ' . $r->msg if is_error($r);
	return 'nil' unless defined $r;
	return ref $r eq 'ARRAY' ? '{' . join(', ', map { reply_string($_) } @$r) . '}' : "$r";
}

#
# One call of the script, checked against the model. Runs in one round trip:
# state and expiry before, the script, state, PTTL and expiry after. Returns a hash with
# the reply, the model's reply and a list of disagreements (empty when all agree).
#
my $sha;

sub run_step
{
	my ($key, $p, $cost, $now) = @_;
	my ($pre, $pre_exp, $reply, $post, $pttl, $post_exp) = pipeline(
		read_state_command($key),
		[ 'PEXPIRETIME', $key ],
		[ 'EVALSHA', $sha, 1, $key, script_args($p, $cost, $now) ],
		read_state_command($key),
		[ 'PTTL', $key ],
		[ 'PEXPIRETIME', $key ]);

	my %res = (reply => $reply, pre => $pre, post => $post, pttl => $pttl, problems => []);
	my $problem = sub { push @{ $res{problems} }, @_ };

	my $state;
	if (defined $pre->[0] || defined $pre->[1])
	{
		$state = [ stored_int($pre->[0]), stored_int($pre->[1]) ];
		if (grep { !defined } @$state)
		{
			$problem->('the stored state is not integers, the model cannot run');
			return \%res;
		}
	}
	my ($want, $want_state, $want_ttl) = model_step($p, $state, $cost, $now);
	$res{model} = $want;
	$res{model_ttl} = $want_ttl;

	if (!(ref $reply eq 'ARRAY' && @$reply == 4 && join(',', @$reply) eq join(',', @$want)))
	{
		$problem->('reply ' . reply_string($reply) . ', model ' . reply_string($want));
	}
	if ($want->[0])
	{
		my @got = map { stored_int($_) } @$post;
		if (grep { !defined } @got or $got[0] != $want_state->[0] or $got[1] != $want_state->[1])
		{
			$problem->('stored ' . raw_state_string($post)
				  . ", model ('$want_state->[0]', '$want_state->[1]')");
		}
		# PTTL is the TTL just set, less the real ms since; a double above 2^53 may round by 1.
		my $slack = $want_ttl >= $LIMIT ? 2 : 0;
		if ($pttl > $want_ttl + $slack || $pttl <= $want_ttl - 1000)
		{
			$problem->("PTTL $pttl after a grant, expected ARGV[6] + pause = $want_ttl");
		}
	}
	else
	{
		if (raw_state_string($post) ne raw_state_string($pre))
		{
			$problem->('a denial changed the state from ' . raw_state_string($pre)
				  . ' to ' . raw_state_string($post));
		}
		if ($post_exp != $pre_exp)
		{
			$problem->("a denial changed the expiry time from $pre_exp to $post_exp");
		}
	}
	return \%res;
}

sub step_inputs
{
	my ($key, $p, $cost, $now) = @_;
	return "key=$key policy($p->{name}) ARGV=["
	  . join(', ', map { "'$_'" } script_args($p, $cost, $now)) . ']';
}

# Deterministic steps: the reply must equal the hand-computed values, and the model must
# agree with the script on the reply and the state left behind.
my @deterministic_disagreements;

sub expect_step
{
	my ($key, $p, $cost, $now, $want, $name) = @_;
	my $res = run_step($key, $p, $cost, $now);
	is(reply_string($res->{reply}), reply_string($want), $name);
	if (@{ $res->{problems} })
	{
		push @deterministic_disagreements,
		  "$name: " . step_inputs($key, $p, $cost, $now) . ': ' . join('; ', @{ $res->{problems} });
	}
	return $res;
}

sub stored
{
	my ($key) = @_;
	return cmd(@{ read_state_command($key) });
}

#
# Start.
#
start_redis();
note "redis-server pid $redis_pid on port $port, dir $tmpdir";

my $script = do
{
	open my $fh, '-|', $COMPOSE, $SCRIPT_PATH or die "cannot run $COMPOSE: $!";
	binmode $fh;
	local $/;
	my $body = <$fh>;
	close $fh or die "$COMPOSE $SCRIPT_PATH failed";
	$body;
};

$sha = cmd('SCRIPT', 'LOAD', $script);
is($sha, sha1_hex($script), "SCRIPT LOAD returns the SHA-1 of lua/$SCRIPT_NAME as composed");

# The policies used below.
my $per_minute = policy(10, 120, 60_000);    # 120 a minute = 2 a second
my $thirds = policy(5, 3, 1000);    # 3 a second: one token every 333.3 ms
my $primes = policy(100, 7, 13);    # 7 tokens every 13 ms
my $day_max = policy(104_249_991, 1, 86_400_000);    # 1 a day, largest exact capacity
my $fast_max = policy(1_501_199_875_790_165, 1 << 52, 3, ttl => 600_000);    # cap+rate = 2^53-1
my $b3_max = policy(94_906_264, 94_906_265, 94_906_266);    # unit and rate both ~2^26.5

# The script's arguments without the group script's tag.
sub bucket_args { my @a = script_args(@_); splice(@a, 1, scalar @TAG); return @a }

subtest 'policy helper: (C, R, P) -> script arguments, as src/algorithm/token_bucket.c' => sub {
	is_deeply([ bucket_args($per_minute, 1, 5) ], [ 5, 5000, 1, 500, 1, 5000 ],
		'120 per minute: gcd 120, unit 500, rate 1, capacity 5000 units, TTL 5000 ms');
	is_deeply([ bucket_args($thirds, 2, undef) ], [ '', 5000, 3, 1000, 2, 1667 ],
		'3 per second: unit 1000, rate 3, TTL rounded up to 1667 ms, empty now');
	is_deeply([ @{$day_max}{qw(unit rate cap)} ], [ 86_400_000, 1, 9_007_199_222_400_000 ],
		'1 per day at the largest capacity: 104249991 * 86400000 units');
	ok($day_max->{cap} + $day_max->{rate} < $LIMIT, 'capacity*unit + rate < 2^53 for it');
	is(policy(104_249_992, 1, 86_400_000), undef, 'one token more is outside the exact bounds');
	is($fast_max->{cap} + $fast_max->{rate}, $LIMIT - 1,
		'C = 1501199875790165 at 2^52 per 3 ms: capacity*unit + rate = 2^53 - 1');
	is(policy(1_501_199_875_790_166, 1 << 52, 3), undef, 'one token more is outside the bounds');
	is_deeply([ @{$b3_max}{qw(unit rate)} ], [ 94_906_266, 94_906_265 ], 'coprime R and P');
	ok($b3_max->{cap} + $b3_max->{rate} < $LIMIT, 'C = 94906264 is within the bounds');
	is(policy(94_906_265, 94_906_265, 94_906_266), undef, 'C = 94906265 is not');
};

subtest 'redis-cli EVAL "$(cat script)" gives the same answer as EVALSHA' => sub {
	my @args = ('cli', script_args($per_minute, 1, $T0));
	open my $fh, '-|', 'redis-cli', '-p', $port, 'EVAL', $script, 1, @args
	  or die "cannot run redis-cli: $!";
	my @lines = <$fh>;
	close $fh;
	chomp @lines;
	is_deeply(\@lines, [ 1, 9, 0, 500 ], 'redis-cli EVAL on a new key: {1, 9, 0, 500}');
	cmd('DEL', 'cli');
	my $r = cmd('EVALSHA', $sha, 1, @args);
	is(reply_string($r), '{1, 9, 0, 500}', 'EVALSHA on a new key: {1, 9, 0, 500}');
};

subtest 'a new key is a full bucket' => sub {
	expect_step('new', $per_minute, 1, $T0, [ 1, 9, 0, 500 ],
		'120/min, cost 1: allowed, 9 left, full again in 500 ms');
	is_deeply(stored('new'), [ 4500, $T0 ], 'stored: level 4500 units, time = now');
	expect_step('new3', $thirds, 5, $T0, [ 1, 0, 0, 1667 ],
		'3/s, cost 5 = capacity on a new key: allowed, 0 left, full in ceil(5000/3) ms');
	expect_step('new_day', $day_max, 1, $T0, [ 1, 104_249_990, 0, 86_400_000 ],
		'1/day at the bound, cost 1: allowed, C-1 left, full in one day');
};

subtest 'taking exactly the capacity is allowed and leaves 0' => sub {
	expect_step('cap', $per_minute, 10, $T0, [ 1, 0, 0, 5000 ], 'cost 10 of 10: allowed, 0 left');
	is_deeply(stored('cap'), [ 0, $T0 ], 'stored level 0');
	expect_step('cap', $per_minute, 1, $T0, [ 0, 0, 500, 5000 ],
		'then cost 1 in the same ms: denied, retry in 500 ms');
	expect_step('cap_b3', $b3_max, 94_906_264, $T0, [ 1, 0, 0, 94_906_265 ],
		'C ~2^26.5 tokens at once: allowed, 0 left, full in ceil(cap/rate) ms');
};

subtest 'a denial takes nothing and writes nothing' => sub {
	expect_step('deny', $per_minute, 10, $T0, [ 1, 0, 0, 5000 ], 'drain the bucket');
	is(cmd('PEXPIRE', 'deny', 3_600_000), 1, 'give the key a 1 h TTL a grant would replace');
	my $before = stored('deny');
	my $exp_before = cmd('PEXPIRETIME', 'deny');
	expect_step('deny', $per_minute, 1, $T0 + 300, [ 0, 0, 200, 4700 ],
		'cost 1 after 300 ms: denied, retry 200, reset 4700');
	expect_step('deny', $per_minute, 10, $T0 + 4999, [ 0, 9, 1, 1 ],
		'cost 10 after 4999 ms: denied, 9 whole tokens, retry 1, reset 1');
	is_deeply(stored('deny'), $before, 'stored level and time unchanged by the denials');
	is_deeply(stored('deny'), [ 0, $T0 ], 'still level 0 at the time of the grant');
	is(cmd('PEXPIRETIME', 'deny'), $exp_before, 'expiry time unchanged by the denials');
	my $pttl = cmd('PTTL', 'deny');
	ok($pttl > 3_600_000 - 1000 && $pttl <= 3_600_000, "PTTL still about 1 h ($pttl)");
	expect_step('deny', $per_minute, 10, $T0 + 5000, [ 1, 0, 0, 5000 ],
		'cost 10 after 5000 ms: allowed, the denials took nothing');
};

subtest 'weighted costs' => sub {
	expect_step('w', $per_minute, 3, $T0, [ 1, 7, 0, 1500 ], 'cost 3 of 10: 7 left, full in 1500 ms');
	expect_step('w', $per_minute, 7, $T0, [ 1, 0, 0, 5000 ], 'cost 7: 0 left');
	expect_step('w', $per_minute, 4, $T0 + 1750, [ 0, 3, 250, 3250 ],
		'cost 4 with 3.5 tokens: denied, 3 whole tokens, retry 250');
	expect_step('w', $per_minute, 4, $T0 + 1999, [ 0, 3, 1, 3001 ], 'cost 4 at +1999: denied, retry 1');
	expect_step('w', $per_minute, 4, $T0 + 2000, [ 1, 0, 0, 5000 ], 'cost 4 at +2000: allowed');
	expect_step('w', $per_minute, 1, $T0 + 2000, [ 0, 0, 500, 5000 ], 'cost 1 right after: denied');
	expect_step('w3', $thirds, 2, $T0, [ 1, 3, 0, 667 ], '3/s, cost 2: 3 left, full in ceil(2000/3)');
	expect_step('w3', $thirds, 3, $T0, [ 1, 0, 0, 1667 ], '3/s, cost 3: 0 left');
	expect_step('w3', $thirds, 2, $T0 + 666, [ 0, 1, 1, 1001 ],
		'cost 2 after 666 ms (1998 units): denied, 1 token, retry 1');
	expect_step('w3', $thirds, 2, $T0 + 667, [ 1, 0, 0, 1667 ], 'cost 2 after 667 ms: allowed');
	expect_step('wp', $primes, 60, $T0, [ 1, 40, 0, 112 ], '7 per 13 ms, cost 60 of 100: reset ceil(780/7)');
};

subtest 'pro-rata refill' => sub {
	expect_step('pr', $per_minute, 10, $T0, [ 1, 0, 0, 5000 ], '120/min: drain');
	expect_step('pr', $per_minute, 1, $T0 + 499, [ 0, 0, 1, 4501 ], 'after 499 ms: no token yet');
	expect_step('pr', $per_minute, 1, $T0 + 500, [ 1, 0, 0, 5000 ], 'after 500 ms: one token back');
	expect_step('pr', $per_minute, 1, $T0 + 1500, [ 1, 1, 0, 4500 ],
		'1000 ms later: two tokens back, one taken, one left');
	expect_step('pr3', $thirds, 5, $T0, [ 1, 0, 0, 1667 ], '3/s: drain');
	expect_step('pr3', $thirds, 1, $T0 + 333, [ 0, 0, 1, 1334 ], 'after 333 ms (999 units): no token');
	expect_step('pr3', $thirds, 1, $T0 + 334, [ 1, 0, 0, 1666 ],
		'after 334 ms (1002 units): one token, 2 units kept');
	is_deeply(stored('pr3'), [ 2, $T0 + 334 ], 'the 2 leftover units are stored');
};

subtest 'refill stops at the capacity' => sub {
	expect_step('idle', $per_minute, 10, $T0, [ 1, 0, 0, 5000 ], 'drain');
	expect_step('idle', $per_minute, 1, $T0 + 1_000_000_000, [ 1, 9, 0, 500 ],
		'after 10^9 ms idle: full (10), not more; 9 left');
	is_deeply(stored('idle'), [ 4500, $T0 + 1_000_000_000 ], 'stored level 4500');
	expect_step('idle', $per_minute, 1, $T0 + 1_000_005_000, [ 1, 9, 0, 500 ],
		'5000 ms more: 9 + 1 capped at 10, 9 left');
	expect_step('idle_fast', $fast_max, 1_501_199_875_790_165, $T0, [ 1, 0, 0, 1 ],
		'2^52 units per ms: drain the whole 1.5e15 tokens');
	expect_step('idle_fast', $fast_max, 1, $T0, [ 0, 0, 1, 1 ], 'same ms: denied, retry 1');
	expect_step('idle_fast', $fast_max, 1, $T0 + 1, [ 1, 1_501_199_875_790_164, 0, 1 ],
		'1 ms later 2^52 units > capacity: full, C-1 left');
	expect_step('idle_fast', $fast_max, 1_501_199_875_790_164, $T0 + 1, [ 1, 0, 0, 1 ],
		'take the rest');
	expect_step('idle_fast', $fast_max, 1_501_199_875_790_165, $T0 + 1 + $T0, [ 1, 0, 0, 1 ],
		'1.8e12 ms idle at 2^52 units/ms (product ~8e27): exactly full again');
	expect_step('clamp', $per_minute, 1, $T0, [ 1, 9, 0, 500 ], 'a new key');
	cmd('SET', 'clamp', '999999 ' . stored('clamp')->[1]);
	expect_step('clamp', $per_minute, 1, $T0, [ 1, 9, 0, 500 ],
		'a stored level above the capacity (smaller policy) counts as full');
};

# Checks retry_after at `now` exactly: denied at now+retry-1, allowed at now+retry.
sub check_retry
{
	my ($key, $p, $cost, $now, $label) = @_;
	my $res = expect_step($key, $p, $cost, $now, model_of($key, $p, $cost, $now),
		"$label: denied at now");
	my $retry = $res->{reply}[2];
	ok($res->{reply}[0] == 0 && $retry > 0, "$label: retry_after $retry > 0");
	my $r1 = expect_step($key, $p, $cost, $now + $retry - 1,
		model_of($key, $p, $cost, $now + $retry - 1), "$label: at now + retry_after - 1");
	is($r1->{reply}[0], 0, "$label: still denied 1 ms before retry_after");
	is($r1->{reply}[2], 1, "$label: then retry_after is 1");
	my $r2 = expect_step($key, $p, $cost, $now + $retry,
		model_of($key, $p, $cost, $now + $retry), "$label: at now + retry_after");
	is($r2->{reply}[0], 1, "$label: allowed exactly at retry_after");
}

# Checks reset_after exactly: a capacity-sized request is denied 1 ms before, allowed at it.
sub check_reset
{
	my ($key, $p, $now, $reset, $label) = @_;
	my $C = $p->{C};
	my $r1 = expect_step($key, $p, $C, $now + $reset - 1,
		model_of($key, $p, $C, $now + $reset - 1), "$label: cost C at now + reset_after - 1");
	is($r1->{reply}[0], 0, "$label: not full 1 ms before reset_after");
	my $r2 = expect_step($key, $p, $C, $now + $reset,
		model_of($key, $p, $C, $now + $reset), "$label: cost C at now + reset_after");
	is($r2->{reply}[0], 1, "$label: full exactly at reset_after");
}

# The model's reply for the key's current state (used where hand values would be long).
sub model_of
{
	my ($key, $p, $cost, $now) = @_;
	my $hm = stored($key);
	my $state = defined $hm->[0] ? [ map { stored_int($_) } @$hm ] : undef;
	my ($reply) = model_step($p, $state, $cost, $now);
	return $reply;
}

subtest 'retry_after and reset_after are exact, rounded up' => sub {
	expect_step('ra', $thirds, 4, $T0, [ 1, 1, 0, 1334 ], '3/s: take 4, 1 left');
	check_retry('ra', $thirds, 3, $T0, '3/s, cost 3 with 1 token');
	expect_step('rb', $primes, 100, $T0, [ 1, 0, 0, 186 ], '7 per 13 ms: drain, reset ceil(1300/7)');
	check_retry('rb', $primes, 37, $T0 + 5, '7 per 13 ms, cost 37');
	expect_step('rc', $per_minute, 9, $T0, [ 1, 1, 0, 4500 ], '120/min: take 9');
	check_reset('rc', $per_minute, $T0, 4500, '120/min, reset 4500');
	expect_step('rd', $b3_max, 94_906_000, $T0, [ 1, 264, 0, 94_906_001 ], 'unit/rate ~2^26.5: take most');
	check_retry('rd', $b3_max, 94_906_000, $T0 + 17, 'unit/rate ~2^26.5, large cost');
	expect_step('re', $b3_max, 94_906_264, 1000, [ 1, 0, 0, 94_906_265 ], 'unit/rate ~2^26.5: drain');
	check_reset('re', $b3_max, 1000, 94_906_265, 'unit/rate ~2^26.5, reset');
};

subtest 'a clock going backwards adds nothing and is not counted twice' => sub {
	expect_step('back', $per_minute, 10, $T0, [ 1, 0, 0, 5000 ], 'drain at T0');
	expect_step('back', $per_minute, 1, $T0 - 2000, [ 0, 0, 2500, 7000 ],
		'cost 1 at T0-2000: denied; retry = 2000 ms pause + 500');
	is_deeply(stored('back'), [ 0, $T0 ], 'the stored time stays T0');
	expect_step('back', $per_minute, 1, $T0 - 1, [ 0, 0, 501, 5001 ],
		'forward again to T0-1: still nothing added');
	expect_step('back', $per_minute, 1, $T0 + 499, [ 0, 0, 1, 4501 ],
		'T0-2000+retry-1 = T0+499: denied');
	expect_step('back', $per_minute, 1, $T0 + 500, [ 1, 0, 0, 5000 ], 'T0-2000+retry = T0+500: allowed');

	expect_step('back2', $per_minute, 1, $T0, [ 1, 9, 0, 500 ], 'take 1 at T0: 4500 units');
	my $res = expect_step('back2', $per_minute, 1, $T0 - 1000, [ 1, 8, 0, 2000 ],
		'take 1 at T0-1000: allowed from stock; reset = 1000 pause + 1000');
	is_deeply(stored('back2'), [ 4000, $T0 ], 'stored time stays T0, not T0-1000');
	ok($res->{pttl} <= 5000 + 1000 && $res->{pttl} > 5000,
		"PTTL is ARGV[6] + the pause: $res->{pttl} in (5000, 6000]");
	expect_step('back2', $per_minute, 1, $T0 + 100, [ 1, 7, 0, 1400 ],
		'T0+100: only 100 ms refilled (4100 units), not 1100 ms; 7 left');

	run_step('back4', $day_max, 104_249_991, $T0);
	my $back4 = run_step('back4', $day_max, 1, $T0 - 40_000_001);
	is(reply_string($back4->{reply}),
		reply_string([ 0, 0, 40_000_001 + 86_400_000, $LIMIT - 1 ]),
		'1/day at the bound, drained, clock 40000001 ms back: reset_after saturates at 2^53 - 1');
	expect_step('back3', $day_max, 104_249_991, $T0, [ 1, 0, 0, 9_007_199_222_400_000 ],
		'1/day at the bound: drain at T0');
	expect_step('back3', $day_max, 1, $T0 - 3_600_000,
		[ 0, 0, 3_600_000 + 86_400_000, 3_600_000 + 9_007_199_222_400_000 ],
		'1 h back: retry and reset include the pause, exactly');
};

subtest 'TTL: set to ARGV[6] (+ pause) on every grant, untouched by a denial' => sub {
	my $res = expect_step('ttl', $per_minute, 1, $T0, [ 1, 9, 0, 500 ], 'grant on a new key');
	ok($res->{pttl} <= 5000 && $res->{pttl} > 4000, "PTTL $res->{pttl} in (4000, 5000]");
	is(cmd('PERSIST', 'ttl'), 1, 'PERSIST the key');
	$res = expect_step('ttl', $per_minute, 1, $T0, [ 1, 8, 0, 1000 ], 'second grant');
	ok($res->{pttl} <= 5000 && $res->{pttl} > 4000, "PTTL set again: $res->{pttl}");
	cmd('PEXPIRE', 'ttl', 3_600_000);
	$res = expect_step('ttl', $per_minute, 1, $T0, [ 1, 7, 0, 1500 ], 'third grant');
	ok($res->{pttl} <= 5000 && $res->{pttl} > 4000, "a longer TTL is replaced too: $res->{pttl}");
	cmd('PERSIST', 'ttl');
	$res = expect_step('ttl', $per_minute, 8, $T0, [ 0, 7, 500, 1500 ], 'a denial (cost 8 of 7)');
	is($res->{pttl}, -1, 'the denial set no TTL');
	my $long = policy(10, 120, 60_000, ttl => 90_000);
	$res = expect_step('ttl2', $long, 1, $T0, [ 1, 9, 0, 500 ], 'ARGV[6] = 90000');
	ok($res->{pttl} <= 90_000 && $res->{pttl} > 89_000, "PTTL $res->{pttl} in (89000, 90000]");
	$res = expect_step('ttl3', $day_max, 1, $T0, [ 1, 104_249_990, 0, 86_400_000 ],
		'ARGV[6] = 9007199222400000 (1/day at the bound)');
	ok($res->{pttl} <= 9_007_199_222_400_000 && $res->{pttl} > 9_007_199_222_399_000,
		"PTTL $res->{pttl}");
};

subtest 'a corrupt state is an error reply, not a grant' => sub {
	my @cases = (
		[ 'level abc', [ 'level', 'abc', 'time', $T0 ] ],
		[ 'negative level', [ 'level', -1, 'time', $T0 ] ],
		[ 'time xyz', [ 'level', 100, 'time', 'xyz' ] ],
		[ 'no time field', [ 'level', 100 ] ],
		[ 'no level field', [ 'time', $T0 ] ],
		[ 'empty level', [ 'level', '', 'time', $T0 ] ],
	);
	for my $case (@cases)
	{
		my ($label, $fields) = @$case;
		my $key = "corrupt:$label";
		cmd('HSET', $key, @$fields);
		my $before = stored($key);
		my $r = cmd('EVALSHA', $sha, 1, $key, script_args($per_minute, 1, $T0 + 1000));
		ok(is_error($r) && $r->msg =~ /corrupt/, "$label: error reply")
		  or diag('got ' . reply_string($r));
		is_deeply(stored($key), $before, "$label: state unchanged");
		is(cmd('PTTL', $key), -1, "$label: no TTL set");
	}
	for my $case ([ 'string x', 'x' ], [ 'string without time', '100 ' ],
		[ 'string with a negative level', "-1 $T0" ], [ 'string 1.5', "1.5 $T0" ],
		[ 'string with three fields', "1 $T0 3" ])
	{
		my ($label, $value) = @$case;
		my $key = "corrupt:$label";
		cmd('SET', $key, $value);
		my $r = cmd('EVALSHA', $sha, 1, $key, script_args($per_minute, 1, $T0 + 1000));
		ok(is_error($r) && $r->msg =~ /corrupt/, "$label: error reply")
		  or diag('got ' . reply_string($r));
		is(cmd('GET', $key), $value, "$label: state unchanged");
		is(cmd('PTTL', $key), -1, "$label: no TTL set");
	}
	# A bucket of ratelimit 0.3 (a hash) is read, and written back as a string.
	cmd('HSET', 'legacy', 'level', 4500, 'time', $T0);
	my $legacy = expect_step('legacy', $per_minute, 1, $T0 + 500, [ 1, 9, 0, 500 ],
		'a hash bucket of 0.3: 4500 units + 500 ms of refill, take 1, 9 left');
	is(cmd('TYPE', 'legacy'), 'string', 'the grant wrote it back as a string');
	is_deeply(stored('legacy'), [ 4500, $T0 + 500 ], 'with the level and time the model says');
	cmd('RPUSH', 'corrupt:list', 'x');
	my $r = cmd('EVALSHA', $sha, 1, 'corrupt:list', script_args($per_minute, 1, $T0));
	ok(is_error($r) && $r->msg =~ /WRONGTYPE/, 'a key of another type: WRONGTYPE error reply');

	{
		my @odd = (
			[ 'level nan', [ 'level', 'nan', 'time', $T0 ] ],
			[ 'level inf', [ 'level', 'inf', 'time', $T0 ] ],
			[ 'level 1e400', [ 'level', '1e400', 'time', $T0 ] ],
			[ 'time nan', [ 'level', 0, 'time', 'nan' ] ],
			[ 'time inf', [ 'level', 100, 'time', 'inf' ] ],
			[ 'time 1e20 with a full level', [ 'level', 5000, 'time', '1e20' ] ],
			[ 'level 1.5', [ 'level', '1.5', 'time', $T0 ] ],
		);
		for my $case (@odd)
		{
			my ($label, $fields) = @$case;
			my $key = "odd:$label";
			cmd('HSET', $key, @$fields);
			my $before = stored($key);
			my $r = cmd('EVALSHA', $sha, 1, $key, script_args($per_minute, 1, $T0 + 1000));
			my $after = stored($key);
			ok(is_error($r) && $r->msg =~ /corrupt/ && raw_state_string($after) eq raw_state_string($before),
				"$label: 'corrupt' error reply, state unchanged")
			  or diag("got " . reply_string($r) . ", state " . raw_state_string($before)
				  . ' -> ' . raw_state_string($after));
		}
	}
};

subtest 'exact integers at the 2^53 bound and with large now values' => sub {
	my $C = $day_max->{C};
	expect_step('bound', $day_max, 12_345, $T0,
		[ 1, $C - 12_345, 0, 12_345 * 86_400_000 ], '1/day, C = 104249991: cost 12345, C - 12345 left');
	expect_step('bound', $day_max, $C - 12_345 + 1, $T0,
		[ 0, $C - 12_345, 86_400_000, 12_345 * 86_400_000 ],
		'cost one more than left: denied, retry exactly one day');
	check_retry('bound', $day_max, $C - 12_345 + 1, $T0 + 3, '1/day at the bound');
	is_deeply(stored('bound'), [ 0, $T0 + 86_400_000 ], 'stored level 0, time exact');
	expect_step('bound2', $day_max, $C - 1, 1000, [ 1, 1, 0, 9_007_199_222_400_000 - 86_400_000 ],
		'cost C - 1: exactly 1 left');
	expect_step('bound2', $day_max, 1, 1000, [ 1, 0, 0, 9_007_199_222_400_000 ], 'cost 1: 0 left');
	check_reset('bound2', $day_max, 1000, 9_007_199_222_400_000, '1/day at the bound, empty');

	my $Cf = $fast_max->{C};
	expect_step('bound_fast', $fast_max, $Cf - 7, $T0, [ 1, 7, 0, 1 ],
		'2^52 per 3 ms, C = 1501199875790165: cost C - 7, 7 left');
	expect_step('bound_fast', $fast_max, 8, $T0, [ 0, 7, 1, 1 ], 'cost 8: denied, retry 1 ms');
	expect_step('bound_fast', $fast_max, $Cf, $T0 + 1, [ 1, 0, 0, 1 ], 'cost C 1 ms later: allowed');
	is_deeply(stored('bound_fast'), [ 0, $T0 + 1 ], 'stored level 0');

	expect_step('bound_b3', $b3_max, 1, $T0, [ 1, $b3_max->{C} - 1, 0, 2 ],
		'unit 94906266, rate 94906265: cost 1, reset ceil(unit/rate) = 2');
	is_deeply(stored('bound_b3'), [ $b3_max->{cap} - 94_906_266, $T0 ], 'stored level exact');

	expect_step('late', $per_minute, 1, $LIMIT - 1, [ 1, 9, 0, 500 ], 'now = 2^53 - 1 works');
	is_deeply(stored('late'), [ 4500, $LIMIT - 1 ], 'stored time 2^53 - 1 exactly');
	expect_step('late', $per_minute, 10, $LIMIT - 1, [ 0, 9, 500, 500 ], 'then cost 10: denied');
};

subtest 'no now argument: the script uses Redis TIME' => sub {
	my $key = 'time:empty';
	my $before = int(Time::HiRes::time() * 1000);
	my $r = cmd('EVALSHA', $sha, 1, $key, script_args($per_minute, 1, undef));
	my $after = int(Time::HiRes::time() * 1000);
	is(reply_string($r), '{1, 9, 0, 500}', 'empty ARGV[1]: a new key is a full bucket');
	my $t = stored_int(stored($key)->[1]);
	ok($t >= $before - 1000 && $t <= $after + 1000,
		"empty ARGV[1]: stored time $t is the wall clock in ms ($before..$after)");

	# Every argument is positional: one missing is refused, never read as another.
	my @short = script_args($per_minute, 1, undef);
	pop @short;
	$r = cmd('EVALSHA', $sha, 1, 'time:short', @short);
	my $refusal = @TAG ? qr/arguments that do not match its keys/ : qr/called with 5 arguments, not 6/;
	ok(is_error($r) && $r->msg =~ $refusal, 'a missing argument is an error reply that says so');
	is_deeply(stored('time:short'), [ undef, undef ], 'and nothing is written');
};

is(scalar @deterministic_disagreements, 0,
	'the Perl model agrees with the script on every step above (reply, state, TTL)')
  or diag(join "\n", @deterministic_disagreements);

#
# Randomized comparison with the model.
#
subtest 'randomized: 2000 operations, every reply and state equal to the model' => sub {
	my $seed = $ENV{RL_SEED} // 20240601;
	srand($seed);
	note "seed $seed (set RL_SEED to change)";

	# A uniform random integer in [0, n), n up to 2^53 and more.
	my $rnd = sub {
		my ($n) = @_;
		return 0 if $n <= 1;
		return int(rand($n)) if $n <= 2**31;
		use integer;
		my $x = (int(rand(2**30)) << 30) | int(rand(2**30));
		return $x % $n;
	};

	# Keys must not expire in real time while the injected clock stands still.
	my $slack_ttl = sub {
		my ($C, $R, $P) = @_;
		my $p = policy($C, $R, $P) or return undef;
		return policy($C, $R, $P, ttl => $p->{refill_ms} + 600_000);
	};
	my @policies = map { $slack_ttl->(@$_) } (
		[ 10, 120, 60_000 ], [ 5, 3, 1000 ], [ 1, 1, 1 ], [ 100, 7, 13 ],
		[ 104_249_991, 1, 86_400_000 ], [ 1_501_199_875_790_165, 1 << 52, 3 ],
		[ 94_906_264, 94_906_265, 94_906_266 ]);
	while (@policies < 11)    # random everyday policies
	{
		my $p = $slack_ttl->(1 + $rnd->(1000), 1 + $rnd->(1_000_000), 1 + $rnd->(86_400_000));
		push @policies, $p if $p;
	}
	while (@policies < 14)    # random policies at the bound: the largest exact capacity
	{
		my ($R, $P) = (1 + $rnd->(2**30), 1 + $rnd->(2**30));
		my $g = gcd($R, $P);
		use integer;
		my $C = ($LIMIT - $R / $g - 1) / ($P / $g);
		my $p = $C >= 1 ? $slack_ttl->($C, $R, $P) : undef;
		push @policies, $p if $p;
	}
	note 'policies: ' . join('; ', map { $_->{name} } @policies);

	my @keys = map { { key => "rand:$_", policies => [ $policies[$_] ] } } 0 .. $#policies;
	# One key whose policy changes capacity (same unit and rate): levels above it clamp.
	push @keys, { key => 'rand:shared', policies => [ $slack_ttl->(10, 120, 60_000),
		$slack_ttl->(4, 120, 60_000) ] };
	cmd('DEL', map { $_->{key} } @keys);
	$_->{now} = $T0 + $rnd->(1000) for @keys;

	my (%count, @mismatches);
	my $i = 0;
	while (($count{ops} // 0) < 2000)
	{
		$i++;
		my $k = $keys[ $rnd->(scalar @keys) ];
		my $p = $k->{policies}[ $rnd->(scalar @{ $k->{policies} }) ];
		my ($C, $unit, $rate) = @{$p}{qw(C unit rate)};
		my $last = $k->{last};    # [cost, now, reply] of the previous step on this key

		if (rand() < 0.02)
		{
			cmd('DEL', $k->{key});    # as if the TTL had expired
			$count{deleted}++;
			$k->{last} = undef;
			next;
		}

		my ($cost, $step, $probe);
		my $r = rand();
		if ($last && $last->[3] == $p && $last->[2][0] == 0 && $r < 0.15)
		{
			# Probe the previous denial's retry_after: 1 ms before, or exactly at it.
			$cost = $last->[0];
			$probe = rand() < 0.5 ? 'retry-1' : 'retry';
			$step = $last->[1] + $last->[2][2] - ($probe eq 'retry-1' ? 1 : 0) - $k->{now};
		}
		elsif ($last && $last->[3] == $p && $last->[2][3] > 0 && $r < 0.22)
		{
			$cost = $C;
			$probe = rand() < 0.5 ? 'reset-1' : 'reset';
			$step = $last->[1] + $last->[2][3] - ($probe eq 'reset-1' ? 1 : 0) - $k->{now};
		}
		else
		{
			my $c = rand();
			$cost = $c < 0.3 ? 1
			  : $c < 0.55 ? 1 + $rnd->($C)
			  : $c < 0.8 ? 1 + $rnd->($C < 5 ? $C : 5)
			  : $c < 0.9 ? $C
			  : 1 + $rnd->($C < 3 ? $C : 3) + int($C / 2);
			$cost = $C if $cost > $C;
			my $t = rand();
			my $token_ms = ceil_div($unit, $rate);
			$step = $t < 0.15 ? 0
			  : $t < 0.45 ? 1 + $rnd->(3 * $token_ms)
			  : $t < 0.60 ? $rnd->(2 * $p->{refill_ms} + 1)
			  : $t < 0.65 ? 1_000_000_000 + $rnd->(1_000_000)
			  : $t < 0.80 ? -(1 + $rnd->(2 * $token_ms))
			  : $t < 0.85 ? -(1 + $rnd->(10_000_000))
			  : 1 + $rnd->(1000);
		}
		my $now = $k->{now} + $step;
		if ($now < 0 || $now >= $LIMIT)
		{
			# Keep the injected clock a valid epoch below 2^53: start the key over.
			cmd('DEL', $k->{key});
			$k->{now} = $T0 + $rnd->(1000);
			$k->{last} = undef;
			$count{restarted}++;
			next;
		}

		my $pre_time = stored_int(stored($k->{key})->[1]);
		my $res = run_step($k->{key}, $p, $cost, $now);
		my $reply = $res->{reply};
		$k->{now} = $now;
		$k->{last} = [ $cost, $now, (ref $reply eq 'ARRAY' ? $reply : [ -1, 0, 0, 0 ]), $p ];

		$count{ops}++;
		$count{backwards}++ if defined $pre_time && $now < $pre_time;
		$count{ ref $reply eq 'ARRAY' && $reply->[0] ? 'granted' : 'denied' }++;
		$count{at_bound}++ if $p->{cap} + $p->{rate} > $LIMIT / 2;
		$count{"probe $probe"}++ if $probe;
		if ($probe)
		{
			my $allowed = ref $reply eq 'ARRAY' && $reply->[0] == 1;
			my $ok = $probe =~ /-1$/ ? !$allowed : $allowed;
			$count{"probe $probe wrong"}++ unless $ok;
		}
		$count{'retry or reset saturated'}++
		  if $res->{model} && grep { $_ == $LIMIT - 1 } @{ $res->{model} }[ 2, 3 ];
		if (@{ $res->{problems} })
		{
			push @mismatches, "step $i: " . step_inputs($k->{key}, $p, $cost, $now)
			  . ' state before ' . raw_state_string($res->{pre}) . ': '
			  . join('; ', @{ $res->{problems} });
		}
	}
	note join ', ', map { "$_: $count{$_}" } sort keys %count;

	is(scalar @mismatches, 0, 'every reply, stored state and TTL equals the model')
	  or diag(join "\n", grep { defined } @mismatches[ 0 .. 9 ]);
	ok(($count{granted} // 0) >= 300 && ($count{denied} // 0) >= 300, 'many grants and denials');
	ok(($count{backwards} // 0) >= 100, 'many steps with the clock behind the stored time');
	ok(($count{at_bound} // 0) >= 300, 'many steps on policies near 2^53');
	for my $probe ('retry-1', 'retry', 'reset-1', 'reset')
	{
		ok(($count{"probe $probe"} // 0) >= 20, "probes at now + $probe: $count{\"probe $probe\"}");
		is($count{"probe $probe wrong"} // 0, 0,
			$probe =~ /-1$/ ? "each probe at $probe was denied" : "each probe at $probe was granted");
	}
};

done_testing();
