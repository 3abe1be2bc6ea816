
# ratelimit.redis_connections = shared: one connection per server and Redis
# node, kept by a background worker, every call waiting at a moment written in
# one pipeline. What a backend promised with its own connection holds: exact
# grants however many sessions race, the deadline, cancel while Redis is
# silent (the late reply dropped, never handed to the next question), a worker
# that stops (its waiting backends decided by their fail modes at once, the
# worker started again), NOSCRIPT, a batch too large to hand off, a reply too
# large to hand back, and a node no worker can be started for (the backend's own
# connection).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $clients = 64;
my $retry_ms = 200;
my $redis = redis_start(name => 'shared');
my $node = rl_node(
	'shared',
	redis => $redis,
	max_connections => $clients + 20,
	conf => [
		"ratelimit.redis_connections = 'shared'",
		"max_worker_processes = 16",
		"ratelimit.command_timeout = '10s'",
		"ratelimit.retry_interval = '${retry_ms}ms'"
	]);
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, deny_cache) VALUES
	  ('race', 100, 1, '1 day', 'closed', false),
	  ('slow', 1000, 1000, '1 day', 'closed', false),
	  ('fresh', 50, 50, '1 day', 'closed', false),
	  ('wide', 10, 10, '1 day', 'closed', false);
	CREATE TABLE grants (pid int);
});

# The server's connections to Redis: clients other than the redis-cli asking.
sub server_clients
{
	return grep { !/cmd=client\|list/ } split /\n/, $redis->cli('CLIENT', 'LIST');
}

# The pids of the server's connection workers.
sub worker_pids
{
	return split /\n/, $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = 'ratelimit connection' ORDER BY pid");
}

sub stat_of
{
	my ($name) = @_;
	return $redis->cli('INFO', 'stats') =~ /^$name:(\d+)/m ? $1 : -1;
}

# (1) 64 sessions race for 100 tokens: exactly 100 grants, on one connection,
# which Redis read fewer times than it ran calls (they came pipelined).
my $reads_before = stat_of('total_reads_processed');
my $dir = PostgreSQL::Test::Utils::tempdir();
append_to_file("$dir/race.sql",
	"INSERT INTO grants SELECT pg_backend_pid() WHERE (rl_consume('race', 'one', 1)).allowed;\n");
run_pgbench($node, 'race', "$dir/race.sql", $clients, 10);
my $calls = $clients * 10;
is($node->safe_psql('postgres', 'SELECT count(*) FROM grants'), '100',
	"exactly 100 grants for 100 tokens, $clients sessions racing");
cmp_ok($node->safe_psql('postgres', 'SELECT count(DISTINCT pid) FROM grants'), '>', 1,
	'grants went to more than one session');
is(scalar(server_clients()), 1, 'the server holds one connection to Redis')
  or diag join "\n", server_clients();
is(scalar(worker_pids()), 1, 'kept by one worker');
my $reads = stat_of('total_reads_processed') - $reads_before;
cmp_ok($reads, '<', $calls * 0.9,
	"Redis read $calls calls in $reads reads: many came in one pipeline");

# (2) The deadline, Redis silent: the fail mode at command_timeout.
my $s = session($node);
is($s->consume('fresh', 'warm')->{source}, 'redis', 'a session decides by Redis');
$redis->pause;
$s->query_ok("SET ratelimit.command_timeout = '300ms'");
my ($elapsed, $d) = timed(sub { $s->consume('slow', 'silent') });
is($d->{source}, 'fail_closed', 'Redis silent: the fail mode decides');
is($d->{stderr}, '', 'without an error');
cmp_ok($elapsed, '>=', 0.3, 'at the deadline');
cmp_ok($elapsed, '<', 1.3, 'not a second later');

# (3) Cancel while Redis is silent; the answer that comes later goes nowhere.
usleep(($retry_ms + 50) * 1000);
$s->query_ok("SET ratelimit.command_timeout = '60s'");
$s->start_query(decision_sql('slow', 'cancelled'));
usleep(300_000);
ok(!$s->done, 'a decision waits for the silent Redis');
my $cancel_start = time;
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $s->pid . ')');
my ($out, $err) = $s->wait_result(10);
is(sqlstate_of($err), '57014', 'pg_cancel_backend cancels it (57014)') or diag $err;
cmp_ok(time - $cancel_start, '<', 1, 'within a second');
$s->query_ok("SET ratelimit.command_timeout = '10s'");
$redis->resume;
usleep(($retry_ms + 50) * 1000);
my $after = $s->consume('fresh', 'own_answer');
is_deeply([ @$after{qw(source remaining capacity policy)} ], [ 'redis', 49, 50, 'fresh' ],
	'Redis back: the session gets the answer to its own question, not the dropped one');

# (4) The worker stops while a decision waits: the decision goes to its fail
# mode at once, not at its deadline, and the postmaster starts the worker again.
my ($worker) = worker_pids();
$redis->pause;
$s->start_query(decision_sql('slow', 'worker_gone'));
usleep(300_000);
my $stop_start = time;
kill 'TERM', $worker;
($out, $err) = $s->wait_result(10);
my $stopped = parse_decision($out);
is($stopped->{source}, 'fail_closed', 'the worker stopped: the waiting decision is the fail mode')
  or diag "$out $err";
cmp_ok(time - $stop_start, '<', 2, 'at once, not at the deadline (10 s)');
$redis->resume;
my $restarted;
for (1 .. 100)
{
	($restarted) = worker_pids();
	last if defined $restarted && $restarted != $worker;
	usleep(100_000);
}
isnt($restarted // $worker, $worker, 'the postmaster started the worker again');
usleep(($retry_ms + 50) * 1000);
is($s->consume('fresh', 'after_restart')->{source}, 'redis', 'and Redis decides through it');

# (5) Redis forgets its scripts: sent again with their bodies, through the worker.
$redis->cli('SCRIPT', 'FLUSH');
my $flushed = $s->consume('fresh', 'after_flush');
is_deeply([ @$flushed{qw(source remaining)} ], [ 'redis', 49 ], 'NOSCRIPT: the script is sent again');

# (6) A batch too large to hand off (more than 16 kB of commands) goes on a
# connection of the backend's own, closed after it.
my $many = $s->query_ok(
	"SELECT count(*) FILTER (WHERE allowed AND source = 'redis') FROM rl_consume_many('wide', "
	  . "ARRAY(SELECT 'subject_' || i FROM generate_series(1, 3000) i))");
is($many, '3000', 'rl_consume_many of 3000 subjects: every one decided by Redis');
is(scalar(server_clients()), 1, 'and the server holds one connection to Redis again');

my $health = $s->query_ok('SELECT node FROM rl_health()');
like($health, qr/^127\.0\.0\.1:\d+$/, "rl_health names the shared connection's node ($health)");

# (6b) A reply too large to hand back (more than 32 kB, from a fake Redis): the fail mode,
# saying why; the exchange that asks again goes on the backend's own connection.
{
	my $fake = fake_redis_start(reply => '$40000' . "\r\n" . ('x' x 40000) . "\r\n");
	my $b = session($node);
	$b->query_ok('SET ratelimit.redis_url = ' . quote_literal($fake->url));
	my $big = $b->consume('slow', 'big');
	is_deeply([ @$big{qw(source stderr)} ], [ 'fail_closed', '' ],
		'a reply too large to hand back: the fail mode, no error');
	is(health($b)->{last_error}, 'protocol: reply too large to share', 'rl_health says why');
	usleep(($retry_ms + 50) * 1000);
	is($b->consume('slow', 'big')->{source}, 'fail_closed', 'asked again on its own connection: the fail mode');
	is(health($b)->{last_error}, 'protocol: unexpected reply',
		'which read the whole reply (not a script\'s answer)');
	$b->quit;
	$fake->stop;
}

# (7) A node no worker can be started for: the backend's own connection, and a LOG line.
my $other = redis_start(name => 'shared_other');
my $few = rl_node(
	'shared_few',
	redis => $redis,
	conf => [ "ratelimit.redis_connections = 'shared'", "max_worker_processes = 2" ]);
$few->safe_psql('postgres',
	"INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p', 5, 5, '1 day')");
my $offset = log_offset($few);
my $f = session($few);
is($f->consume('p', 'a')->{source}, 'redis', 'the first node gets the one worker left');
$f->query_ok('SET ratelimit.redis_url = ' . quote_literal($other->url));
my $fallback = $f->consume('p', 'b');
is_deeply([ @$fallback{qw(source stderr)} ], [ 'redis', '' ],
	'a node beyond max_worker_processes: decided by Redis on the backend\'s own connection');
ok(wait_for_log($few, qr/no shared connection to a Redis node, this backend uses its own/, $offset),
	'the log says so, with what to raise');
$f->quit;
$s->quit;
$few->stop;
$other->stop;

done_testing();
