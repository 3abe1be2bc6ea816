#!/usr/bin/perl
#
# Allowances across servers: four PostgreSQL servers share one Redis, one key scope and
# one installation, so one bucket per subject; 16 clients on each hammer one hot subject
# (capacity 10,000, a refill of one token a day). Each server grants from its own slices
# of the bucket: together they grant no more than 10,000, and at least 9,500 before the
# run ends, with a Redis call for a small part of the decisions. Then the same with one
# server killed (kill -9 of its postmaster) while it holds a slice: what it held is lost,
# never granted by anyone else, and nothing is granted over the policy.

use strict;
use warnings;

use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'allowances');
my @nodes = map { rl_node("allow$_", redis => $redis, max_connections => 30) } 1 .. 4;
my $dir = PostgreSQL::Test::Utils::tempdir();

# One installation everywhere (as a restored dump or a replica would have it), and the
# same policies inserted in the same order: the same versions, so the same keys.
my $installation = $nodes[0]->safe_psql('postgres', 'SELECT last_value FROM rl_installation_seq');
foreach my $node (@nodes)
{
	$node->safe_psql(
		'postgres', qq{
		SELECT setval('rl_installation_seq', $installation);
		INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
		VALUES ('al.hot', 10000, 1, '1 day', 100, '2 s'),
		       ('al.kill', 10000, 1, '1 day', 100, '2 s');
		CREATE TABLE seen (policy text, source text);
	});
}
is(join(',', map { $_->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'al.hot'}) } @nodes),
	join(',', ($nodes[0]->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'al.hot'})) x 4),
	'the four servers have the same policy version');

# Starts pgbench on node: clients x transactions, each one take of policy's hot subject,
# its grant recorded (committed with it), then a pause of pause ms if given.
sub hammer
{
	my ($node, $policy, $clients, $transactions, $pause) = @_;
	my $file = "$dir/hammer_$policy.sql";
	append_to_file($file,
		"INSERT INTO seen SELECT '$policy', source FROM rl_consume('$policy', 'hot') WHERE allowed;\n"
		  . ($pause ? "\\sleep $pause ms\n" : ''))
	  unless -e $file;
	my $run = { out => '', err => '' };
	$run->{handle} = IPC::Run::start(
		[
			'pgbench', '-n',
			'-h' => $node->host,
			'-p' => $node->port,
			'-c' => $clients,
			'-j' => 2,
			'-t' => $transactions,
			'-f' => $file,
			'postgres'
		],
		'<', \undef, '>', \$run->{out}, '2>', \$run->{err},
		IPC::Run::timeout(300));
	return $run;
}

sub granted
{
	my ($node, $policy, $source) = @_;
	my $where = $source ? " AND source = '$source'" : '';
	return $nodes[$node]->safe_psql('postgres', "SELECT count(*) FROM seen WHERE policy = '$policy'$where");
}

sub in_redis
{
	my ($policy) = @_;
	return $nodes[0]->safe_psql('postgres', "SELECT remaining FROM rl_peek('$policy', 'hot')");
}

sub evalsha { return $redis->command_calls('evalsha') + $redis->command_calls('eval') }

# True while the backend pid exists (not a zombie).
sub backend_alive
{
	my ($pid) = @_;
	open(my $status, '<', "/proc/$pid/status") or return 0;
	local $/;
	return <$status> !~ /^State:\s+Z/m;
}

# The bucket is one: a take on one server is seen by the others.
$nodes[0]->safe_psql('postgres', q{SELECT rl_consume('al.hot', 'probe')});
is($nodes[3]->safe_psql('postgres', q{SELECT remaining FROM rl_peek('al.hot', 'probe')}),
	'9999', 'a take on the first server is seen by the fourth: one bucket');

###
### Four servers, 16 clients each, 200 takes each: 12,800 asks for 10,000 tokens.
###

my $calls_before = evalsha();
my $started = time;
my @runs = map { hammer($_, 'al.hot', 16, 200) } @nodes;
foreach my $i (0 .. 3)
{
	my $ok = eval { $runs[$i]{handle}->finish };
	note "pgbench on server " . ($i + 1) . ":\n$runs[$i]{out}\n$runs[$i]{err}";
	ok($ok, 'pgbench on server ' . ($i + 1) . ' exits 0');
}
my $seconds = time - $started;
my $calls = evalsha() - $calls_before;
my @granted = map { granted($_, 'al.hot') } 0 .. 3;
my $total = 0;
$total += $_ foreach @granted;
my $sliced = 0;
$sliced += granted($_, 'al.hot', 'allowance') foreach 0 .. 3;
note sprintf('12,800 asks in %.1f s: granted %s (total %d, %d from slices); %d Redis calls, %.4f per decision',
	$seconds, join(' + ', @granted), $total, $sliced, $calls, $calls / 12800);
cmp_ok($total, '<=', 10000, "the four servers granted no more than the policy: $total <= 10,000");
cmp_ok($total, '>=', 9500, "and at least 9,500 before the run ended: $total");
cmp_ok($granted[$_], '>', 0, 'server ' . ($_ + 1) . ' granted some') foreach 0 .. 3;
cmp_ok($sliced, '>', $total / 2, "most grants came from slices ($sliced of $total)");
cmp_ok($calls, '<', 12800 / 10, "Redis saw a call for under a tenth of the asks ($calls)");
# What Redis holds and what was granted never exceed the bucket; the rest is parked in
# the servers' slices, at most one allowance each.
my $left = in_redis('al.hot');
cmp_ok($total + $left, '<=', 10000, "granted + left in Redis <= 10,000 ($total + $left)");
cmp_ok(10000 - $total - $left, '<=', 4 * 100, 'at most one allowance parked per server');

###
### The same, with the fourth server killed while it holds a slice: clients that pause
### 5 ms between takes, so that the run lasts a few seconds.
###

@runs = map { hammer($_, 'al.kill', 16, 400, 5) } @nodes;
# Wait until the fourth server grants from a slice, then kill its postmaster.
my $deadline = time + 60;
usleep(50_000) until time > $deadline || granted(3, 'al.kill', 'allowance') > 0;
cmp_ok(granted(3, 'al.kill', 'allowance'), '>', 0, 'the fourth server grants from a slice');
my $killed_pid = $nodes[3]->{_pid};
$nodes[3]->kill9;
note 'killed the fourth server';
foreach my $i (0 .. 2)
{
	my $ok = eval { $runs[$i]{handle}->finish };
	note "pgbench on server " . ($i + 1) . ":\n$runs[$i]{out}\n$runs[$i]{err}";
	ok($ok, 'pgbench on server ' . ($i + 1) . ' exits 0');
}
eval { $runs[3]{handle}->finish };
note "pgbench on the killed server:\n$runs[3]{out}\n$runs[3]{err}";
# Its committed grants survive crash recovery: count them too. (It starts once its
# orphaned backends, which end on the postmaster's death, have let go of its memory.)
# And once the killed postmaster itself is gone, not only dead: until its parent has reaped
# it, its PID still answers, and a new postmaster refuses its lock file.
$deadline = time + 60;
usleep(100_000)
  while (`pgrep -f 'postgres: allo[w]4: '` ne '' || kill(0, $killed_pid)) && time < $deadline;
$nodes[3]->start;
@granted = map { granted($_, 'al.kill') } 0 .. 3;
$total = 0;
$total += $_ foreach @granted;
$left = in_redis('al.kill');
note sprintf('with a server killed: granted %s (total %d), %d left in Redis',
	join(' + ', @granted), $total, $left);
cmp_ok($total, '<=', 10000, "nothing granted over the policy: $total <= 10,000");
cmp_ok($total + $left, '<=', 10000, "granted + left in Redis <= 10,000 ($total + $left)");
# Lost: the killed server's slice, and its grants whose transactions did not commit.
cmp_ok(10000 - $total - $left, '<=', 100 + 16, 'lost: at most its slice and its 16 clients\' last takes');
cmp_ok($total, '>=', 9000, 'the others went on granting what was left');

# The restarted server's slices are gone: its next take asks Redis.
is($nodes[3]->safe_psql('postgres', q{SELECT source FROM rl_consume('al.hot', 'after_restart')}),
	'redis', 'after the restart, a take asks Redis');

###
### Redis silent while a backend fetches a slice and another waits for it: a cancel ends
### each at once, and afterwards the subject is decided again (the fetch did not stick).
###

my $node = $nodes[0];
$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
	VALUES ('al.wait', 1000, 1, '1 day', 2, '1 hour')});
# 1 from Redis, a slice of 2 (1 left), its last: the next take fetches a slice.
is(join(',', map { $node->safe_psql('postgres', q{SELECT source FROM rl_consume('al.wait', 'w')}) } 1 .. 3),
	'redis,redis,allowance', 'a subject with its slice spent');
my $fetcher = session($node, options => '-c ratelimit.command_timeout=60s');
my $waiter = session($node, options => '-c ratelimit.command_timeout=60s');
my $fetcher_pid = $fetcher->query_ok('SELECT pg_backend_pid()');
my $waiter_pid = $waiter->query_ok('SELECT pg_backend_pid()');
$redis->pause;
$fetcher->start_query(q{SELECT source FROM rl_consume('al.wait', 'w')});
usleep(300_000);
$waiter->start_query(q{SELECT source FROM rl_consume('al.wait', 'w')});
usleep(300_000);
ok(!$fetcher->done && !$waiter->done, 'the fetch waits for the silent Redis, and the other take for it');
is($node->safe_psql('postgres', "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $waiter_pid"),
	'Extension', 'the other take waits for the fetch (not for Redis)');
foreach my $s ([ $waiter, $waiter_pid, 'the waiting take' ], [ $fetcher, $fetcher_pid, 'the fetch' ])
{
	my $cancelled_at = time;
	$node->safe_psql('postgres', "SELECT pg_cancel_backend($s->[1])");
	my (undef, $err) = $s->[0]->wait_result(10);
	like($err, qr/canceling statement due to user request/, "pg_cancel_backend cancels $s->[2]");
	cmp_ok(time - $cancelled_at, '<', 1, 'within a second');
}
$redis->resume;
is($waiter->query_ok(q{SELECT allowed || ' ' || source FROM rl_consume('al.wait', 'w')}), 'true redis',
	'afterwards, the next take fetches a slice again');
$fetcher->quit;

# A backend terminated while it fetches: its fetch ends with it, and nobody waits for it.
is($waiter->query_ok(q{SELECT source FROM rl_consume('al.wait', 'w')}), 'allowance',
	'the slice taken again is spent');
my $doomed = session($node, options => '-c ratelimit.command_timeout=60s');
my $doomed_pid = $doomed->query_ok('SELECT pg_backend_pid()');
$redis->pause;
$doomed->start_query(q{SELECT source FROM rl_consume('al.wait', 'w')});
usleep(300_000);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($doomed_pid)");
my $gone_deadline = time + 10;
usleep(50_000) until !backend_alive($doomed_pid) || time > $gone_deadline;
ok(!backend_alive($doomed_pid), 'the fetching backend is gone');
$redis->resume;
my $asked_at = time;
is($waiter->query_ok(q{SELECT source FROM rl_consume('al.wait', 'w')}), 'redis',
	'the next take fetches a slice itself');
cmp_ok(time - $asked_at, '<', 2, 'at once: it did not wait for the dead backend\'s fetch');
eval { $doomed->quit };

# Redis down while a slice is fetched: the take is decided by the fail mode, and the
# fetch ends with it; once Redis is back, the next take fetches at once (it does not
# wait for a fetch that failed).
is($waiter->query_ok(q{SELECT source FROM rl_consume('al.wait', 'w')}), 'allowance',
	'again a slice spent');
$redis->kill9;
is($waiter->query_ok(q{SELECT allowed || ' ' || source FROM rl_consume('al.wait', 'w')}),
	'false fail_closed', 'Redis down during the fetch: the fail mode decides');
$redis->restart;
usleep(1_200_000);    # the breaker's retry_interval
$asked_at = time;
is($waiter->query_ok(q{SELECT allowed || ' ' || source FROM rl_consume('al.wait', 'w')}), 'true redis',
	'Redis back: the next take fetches a slice');
cmp_ok(time - $asked_at, '<', 2, 'at once: the failed fetch ended with its take');
$waiter->quit;

###
### A hot subject over its limit (its tokens trickle in far slower than it is asked): an
### allowance costs no more Redis calls than none. A take that waited for another
### backend's fetch tries the new slice, then the denial that fetch met, before it asks
### Redis (0.8.0 asked, or fetched again: the takes queued behind one fetch after another).
###
$nodes[0]->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
	VALUES ('al.limit', 20, 2000, '1 s', 20, '1 s'), ('al.limit_plain', 20, 2000, '1 s', NULL, '1 s');
});
my %at_limit;
foreach my $policy (qw(al.limit_plain al.limit))
{
	my $before = evalsha();
	my $run = hammer($nodes[0], $policy, 16, 300);
	ok(eval { $run->{handle}->finish }, "$policy: pgbench exits 0");
	$at_limit{$policy} = (evalsha() - $before) / (16 * 300);
}
note sprintf('a hot subject at its limit: %.3f Redis calls per decision with an allowance, %.3f without',
	$at_limit{'al.limit'}, $at_limit{'al.limit_plain'});
cmp_ok($at_limit{'al.limit'}, '<=', 1.1 * $at_limit{'al.limit_plain'} + 0.02,
	'a hot subject at its limit: an allowance costs no more Redis calls per decision than none');

# What makes that so: a fetch that finds the bucket holding less than it asked for starves
# the subject for allowance_ttl, and its takes are plain ones meanwhile (no fetch, nobody
# waiting for one). Capacity 4, never refilled, slices of at most 3.
$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, allowance, allowance_ttl)
	VALUES ('al.starve', 4, 1, '1 day', 3, '1 s')});
my $starve = session($node);
my $take = q{SELECT allowed || ' ' || source FROM rl_consume('al.starve', 's')};
# 1 from Redis; a slice of 2 (1 left), then its last; a fetch of 3 that finds 1.
is(join(',', map { $starve->query_ok($take) } 1 .. 4), 'true redis,true redis,true allowance,true redis',
	'a fetch that found less than it asked for');
$starve->query_ok(q{SELECT rl_refund('al.starve', 's', 4)});
is(join(',', map { $starve->query_ok($take) } 1 .. 3), 'true redis,true redis,true redis',
	'the bucket refilled: takes within allowance_ttl still ask Redis for their cost alone');
usleep(1_100_000);
is(join(',', map { $starve->query_ok($take) } 1 .. 2), 'true redis,false redis',
	'after allowance_ttl, a fetch again (of the last token; then a denial)');
$starve->query_ok(q{SELECT rl_reset('al.starve', 's')});
is(join(',', map { $starve->query_ok($take) } 1 .. 2), 'true redis,true allowance',
	'rl_reset ends the starving: a full bucket is fetched from at once');
$starve->quit;

$_->stop foreach @nodes;
done_testing();
