
# Never hang a backend: with Redis frozen (SIGSTOP) a decision keeps its
# deadline (command_timeout), statement_timeout and pg_cancel_backend stop it,
# the connection cut off mid-request is replaced, not reused, and a server
# that never completes the TCP handshake costs connect_timeout at most.
#
# A timeout opens the circuit breaker: decisions then skip Redis for
# ratelimit.retry_interval (short here) until one probes it again. The tests
# that must wait for Redis wait for that probe, or run in a session that SETs
# its own ratelimit.redis_url, which has a breaker of its own.

use strict;
use warnings;

use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $retry_ms = 200;
my $redis = redis_start(name => 'cancel');
my $node = rl_node('cancel', redis => $redis,
	conf => ["ratelimit.retry_interval = '${retry_ms}ms'"]);

# Sleeps until the breaker lets the next decision probe Redis.
sub wait_for_probe { usleep(($retry_ms + 50) * 1000); }

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('slow', 1000, 1000, '1 day', 'closed'),
	  ('slow_open', 1000, 1000, '1 day', 'open'),
	  ('fresh', 50, 50, '1 day', 'closed');
});

# Ids of Redis clients other than redis-cli asking for the list.
sub client_ids
{
	my @lines = split /\n/, $redis->cli('CLIENT', 'LIST');
	return map { /^id=(\d+) / ? $1 : () } grep { !/cmd=client\|list/ } @lines;
}

my $s = session($node);
my $pid = $s->pid;
my $warm = $s->consume('slow', 'cancel_subject');
is($warm->{source}, 'redis', 'before the pause, Redis decides');
$s->consume('slow_open', 'cancel_subject');
my @ids_before = client_ids();
is(scalar @ids_before, 1, 'the session holds one Redis connection');

my $offset = log_offset($node);
$redis->pause;

# (a) command_timeout: the fail mode decides at the deadline (each decision
# here is the probe the breaker lets through), and in the meantime at once.
$s->query_ok("SET ratelimit.command_timeout = '300ms'");
for my $policy (qw(slow slow_open))
{
	wait_for_probe();
	my ($elapsed, $d) = timed(sub { $s->consume($policy, 'cancel_subject') });
	my $want = $policy eq 'slow' ? 'fail_closed' : 'fail_open';
	is($d->{source}, $want, "Redis frozen, command_timeout 300ms: $want ($policy)");
	is($d->{stderr}, '', "Redis frozen, $policy: no error");
	cmp_ok($elapsed, '>=', 0.3, "$policy: waited the whole deadline");
	cmp_ok($elapsed, '<', 1.3, "$policy: and not a second longer");

	($elapsed, $d) = timed(sub { $s->consume($policy, 'cancel_subject') });
	is($d->{source}, $want, "$policy: the next decision is the fail mode too");
	cmp_ok($elapsed, '<', 0.2, "$policy: without waiting for Redis (breaker open)");
}
ok(wait_for_log($node, qr/\[$pid\].*Redis cannot answer \(timeout: /, $offset),
	'the log says Redis timed out');

# (b) statement_timeout cuts a longer command_timeout short. From here to (d)
# the session has its own ratelimit.redis_url (the same server): its own
# breaker, closed, so that every decision goes to Redis and none is a probe.
# (A probe cancelled here is not the subject of this test: 071 tests that a
# cancelled probe does not hold the server-wide breaker.)
$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($redis->url));
is($s->query_ok('SELECT shared FROM rl_health()'), 'f',
	'a session that SETs ratelimit.redis_url has a breaker of its own');
$s->query_ok("SET ratelimit.command_timeout = '60s'; SET statement_timeout = '500ms'");
my ($elapsed, $d) = timed(sub { $s->consume('slow', 'cancel_subject') });
is(sqlstate_of($d->{stderr}), '57014', 'statement_timeout cancels the decision (57014)')
  or diag $d->{stderr};
like($d->{stderr}, qr/statement timeout/, 'because of the statement timeout');
cmp_ok($elapsed, '>=', 0.5, 'after the statement timeout');
cmp_ok($elapsed, '<', 1.5, 'within a second of it');
$s->query_ok('RESET statement_timeout');

# (c) pg_cancel_backend while the decision waits.
$s->start_query(decision_sql('slow', 'cancel_subject'));
usleep(300_000);
ok(!$s->done, 'the decision is still waiting for Redis');
my $cancel_start = time;
is($node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)"),
	't', 'pg_cancel_backend sent');
my ($out, $err) = $s->wait_result(10);
my $cancel_elapsed = time - $cancel_start;
is(sqlstate_of($err), '57014', 'pg_cancel_backend cancels the decision (57014)')
  or diag $err;
like($err, qr/canceling statement due to user request/, 'as a user request');
cmp_ok($cancel_elapsed, '<', 1, 'within a second of the cancel');
my $cancel_log = log_since($node, $offset);
like($cancel_log, qr/canceling statement due to user request/, 'the cancel is logged');
unlike($cancel_log, qr/cancel_subject/,
	'without the statement (timeouts and cancels alike), which holds the subject');

# (d) Redis thaws: the same session decides by Redis again, on a new
# connection. A reused one would hand back the stale answer to (c), a
# decision of policy slow (remaining 99x), not one of fresh (49).
$s->query_ok("SET ratelimit.command_timeout = '10s'");
$redis->resume;
my $after = $s->consume('fresh', 'fresh_subject');
is_deeply(
	[ @$after{qw(source allowed remaining capacity policy stderr)} ],
	[ 'redis', 't', 49, 50, 'fresh', '' ],
	'after SIGCONT the session is decided by Redis, with the answer to its own question')
  or diag explain $after;
is($s->query_ok('SELECT pg_backend_pid()'), $pid, 'in the same backend');

my @ids_after;
my $deadline = time + 5;
do
{
	usleep(50_000);
	@ids_after = client_ids();
} until (@ids_after == 1 || time > $deadline);
is(scalar @ids_after, 1, 'the session holds one Redis connection again');
ok(!(grep { $_ == $ids_before[0] } @ids_after), 'a new one: the old one was closed');
is($s->consume('slow', 'cancel_subject')->{source},
	'redis', 'and it keeps working');
$s->query_ok('RESET ratelimit.redis_url');

###
### connect_timeout: a server whose accept queue is full never completes the
### handshake (Linux drops the SYN), so the connect waits until its deadline.
###

my $listener = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => 0,
	Listen => 0,
	ReuseAddr => 1) or die "could not listen: $!";
my @fillers;
my $full = 0;
for (1 .. 64)
{
	my $filler = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $listener->sockport,
		Timeout => 0.3);
	if (!$filler)
	{
		$full = 1;
		last;
	}
	push @fillers, $filler;
}

SKIP:
{
	skip 'could not fill the accept queue of a listening socket', 11 unless $full;

	my $url = 'redis://127.0.0.1:' . $listener->sockport;
	$offset = log_offset($node);
	$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($url)
		  . "; SET ratelimit.connect_timeout = '300ms'");
	($elapsed, $d) = timed(sub { $s->consume('slow', 'cancel_subject') });
	is($d->{source}, 'fail_closed', 'connect timeout: the fail mode decides');
	is($d->{stderr}, '', 'connect timeout: no error');
	cmp_ok($elapsed, '>=', 0.3, 'connect timeout: waited the whole deadline');
	cmp_ok($elapsed, '<', 1.3, 'connect timeout: and not a second longer');
	ok( wait_for_log(
			$node, qr/\[$pid\].*Redis cannot answer \(timeout: connect timeout\)/,
			$offset),
		'the log says the connect timed out');

	# A dead Redis does not cost every call a connect timeout (docs/design.md, principle 4):
	# until retry_interval has passed, decisions skip it.
	($elapsed, $d) = timed(sub { $s->consume('slow', 'cancel_subject') });
	is($d->{source}, 'fail_closed', 'right after the connect timeout: the fail mode decides');
	cmp_ok($elapsed, '<', 0.2, 'without trying to connect again');

	# statement_timeout while connecting (the probe, once retry_interval has passed).
	wait_for_probe();
	$s->query_ok("SET ratelimit.connect_timeout = '60s'; SET statement_timeout = '500ms'");
	($elapsed, $d) = timed(sub { $s->consume('slow', 'cancel_subject') });
	is(sqlstate_of($d->{stderr}), '57014', 'statement_timeout cancels a connect (57014)')
	  or diag $d->{stderr};
	cmp_ok($elapsed, '<', 1.5, 'within a second of the statement timeout');
	$s->query_ok('RESET statement_timeout');

	# The server's own Redis has the server-wide breaker, untouched by this URL.
	$s->query_ok('RESET ratelimit.redis_url; RESET ratelimit.connect_timeout');
	is($s->consume('slow', 'cancel_subject')->{source},
		'redis', 'back on the real Redis, it decides');
	is($s->query_ok('SELECT pg_backend_pid()'), $pid, 'still the same backend');
}
close $_ for @fillers;
close $listener;

###
### Postmaster death while a decision waits: the backend exits (WL_EXIT_ON_PM_DEATH).
###

$s->query_ok("SET ratelimit.command_timeout = '60s'");
$redis->pause;
$s->start_query(decision_sql('slow', 'cancel_subject'));
usleep(300_000);
ok(!$s->done, 'a decision waits for the frozen Redis');
$node->kill9;

# True while process pid exists and is not a zombie.
sub alive
{
	my ($p) = @_;
	open(my $status, '<', "/proc/$p/status") or return 0;
	local $/;
	my $text = <$status>;
	return $text !~ /^State:\s+Z/m;
}
$deadline = time + 5;
usleep(50_000) while alive($pid) && time < $deadline;
ok(!alive($pid), 'the waiting backend exits when the postmaster dies');
kill 'KILL', $pid if alive($pid);
$redis->resume;
$s->quit;

$redis->stop;
done_testing();
