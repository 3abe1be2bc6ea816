
# What a transaction end, DISCARD ALL or backend exit owes Redis, against a real
# redis-server (and a real PgBouncer): it goes as one pipeline, one round trip
# per connection bounded by one command_timeout, however many reservations or
# leases there are (100000 refunds on ROLLBACK, with Redis up, paused, or the
# backend terminated meanwhile; 30 refunds behind a 200 ms round trip; 20000
# session leases at a fast shutdown); an idle connection that Redis closed
# (SIGKILL and restart, a clean restart, CLIENT KILL) is opened again within
# the next call; and DISCARD ALL, as a pooler runs it between clients, gives
# session leases back.
#
# Every figure measured is printed with note, to be quoted.

use strict;
use warnings;

use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

# Server-wide: a session's longer command_timeout that times out opens the shared
# breaker; retry_interval is short so that it closes again soon after.
my $retry_ms = 200;
my $redis = redis_start(name => 'transaction_end');
my $node = rl_node(
	'transaction_end',
	redis => $redis,
	max_connections => 30,
	conf => [
		"ratelimit.command_timeout = '1s'",
		"ratelimit.connect_timeout = '500ms'",
		"ratelimit.retry_interval = '${retry_ms}ms'",
	]);

my $many = 100_000;
my $many_capacity = 1_000_000;
my $far_count = 30;
my $far_capacity = 10;
my $lease_count = 20_000;

# Big buckets that refill one token a day: one token taken per subject, nothing
# refills during the test (levels are read as whole tokens, and are exact).
$node->safe_psql(
	'postgres', qq{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('te.many_up', $many_capacity, 1, '1 day', 'closed'),
	  ('te.many_paused', $many_capacity, 1, '1 day', 'closed'),
	  ('te.many_term', $many_capacity, 1, '1 day', 'closed'),
	  ('te.far', $far_capacity, $far_capacity, '1 day', 'closed'),
	  ('te.idle', 1000, 1000, '1 day', 'closed');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, fail_mode) VALUES
	  ('te.leases', 'concurrency', $lease_count, '10 min', 'closed'),
	  ('te.pool', 'concurrency', 1, '10 min', 'closed'),
	  ('te.pool_tx', 'concurrency', 1, '10 min', 'closed'),
	  ('te.bouncer', 'concurrency', 1, '10 min', 'closed');
});

# "allowed|remaining|source" of rl_peek in a new session: takes nothing.
sub peek
{
	my ($policy, $subject) = @_;
	return $node->safe_psql('postgres',
		sprintf('SELECT allowed, remaining, source FROM rl_peek(%s, %s)',
			quote_literal($policy), quote_literal($subject)));
}

# Of the subjects prefix || g for g = step, 2 step, ... n, how many rl_peek shows
# at level (answered by Redis), and how many were looked at: "matching|looked at".
sub level_count
{
	my ($policy, $prefix, $step, $n, $level) = @_;
	return $node->safe_psql(
		'postgres',
		sprintf(
			'SELECT count(*) FILTER (WHERE p.remaining = %d AND p.source = %s), count(*)
			 FROM generate_series(%d, %d, %d) g, LATERAL rl_peek(%s, %s || g) p',
			$level, quote_literal('redis'), $step, $n, $step,
			quote_literal($policy), quote_literal($prefix)));
}

# The SQL that reserves one token for each of the subjects prefix || 1 .. n, and
# counts the reservations granted.
sub reserve_many_sql
{
	my ($policy, $prefix, $n) = @_;
	return sprintf(
		'SELECT count(*) FROM generate_series(1, %d) g, LATERAL rl_reserve(%s, %s || g) r WHERE r.allowed',
		$n, quote_literal($policy), quote_literal($prefix));
}

# The lines of log that say reservations (or leases) were not given back.
sub loss_lines
{
	my ($log) = @_;
	return $log =~ /^.*ratelimit: \d+ (?:reservations? (?:was|were|may) not (?:have been )?refunded|leases? (?:was|were|may) not (?:have been )?released):.*$/mg;
}

# Waits until Redis decides again (the shared breaker closed after an outage).
sub wait_for_redis
{
	my ($what) = @_;
	ok( $node->poll_query_until(
			'postgres', "SELECT source = 'redis' FROM rl_peek('te.idle', 'probe')"),
		"Redis decides again $what");
}

###
### (4) Transaction end costs one round trip per connection, bounded by one
###     command_timeout. The reservations of (a), (b) and (c), and the 30 behind
###     the slow proxy of (d), are made at the same time, in four sessions.
###

my $proxy = delay_proxy_start(target_port => $redis->port, delay_ms => 100);
my $up = session($node, options => '-c ratelimit.command_timeout=10s');
my $paused = session($node, options => '-c ratelimit.command_timeout=1s');
my $term = session($node, options => '-c ratelimit.command_timeout=3s');
# (d)'s session keeps its buckets in Redis through the proxy: its
# ratelimit.redis_url (a superuser's setting) comes in the startup packet.
my $far = session($node,
	options => '-c ratelimit.command_timeout=5s -c ratelimit.redis_url=' . $proxy->url);

my %reserving = (
	up => [ $up, 'te.many_up', 'tenant_', $many ],
	paused => [ $paused, 'te.many_paused', 'tenant_', $many ],
	term => [ $term, 'te.many_term', 'tenant_', $many ],
	far => [ $far, 'te.far', 'far_', $far_count ],);
my $reserve_start = time;
foreach my $name (sort keys %reserving)
{
	my ($s, $policy, $prefix, $n) = @{ $reserving{$name} };
	$s->query_ok('BEGIN');
	$s->start_query(reserve_many_sql($policy, $prefix, $n));
}
foreach my $name (sort keys %reserving)
{
	my ($s, $policy, $prefix, $n) = @{ $reserving{$name} };
	my ($out, $err) = $s->wait_result(180);
	is("$out$err", $n, "$name: all $n reservations granted in one transaction");
	note sprintf('%s: %d reservations in one statement, done %.3f s after the four sessions started',
		$name, $n, time - $reserve_start);
}
is(level_count('te.many_up', 'tenant_', 1000, $many, $many_capacity - 1), '100|100',
	'(a) while the transaction runs, another session sees one token gone from each bucket looked at');
is(level_count('te.far', 'far_', 1, $far_count, $far_capacity - 1), "$far_count|$far_count",
	'(d) the 30 reservations made through the proxy are in the same Redis');

##
## (4a) 100000 reservations, Redis up, command_timeout 10 s: ROLLBACK refunds them all.
##

my $offset = log_offset($node);
# The refund script is new to the connection: the first refund carries its body,
# the other 99999 name it by SHA1, and none answers NOSCRIPT.
$redis->cli('SCRIPT', 'FLUSH');
my ($evals, $evalshas) = ($redis->command_calls('eval'), $redis->command_calls('evalsha'));
my ($secs, $out, $err) = timed(sub { $up->query('ROLLBACK', 60) });
note sprintf('(a) ROLLBACK of %d reservations, Redis up: %.3f s', $many, $secs);
is($err, '', '(a) the ROLLBACK raised nothing');
is($redis->command_calls('eval') - $evals, 1, '(a) one refund carried the script (EVAL)');
is($redis->command_calls('evalsha') - $evalshas, $many - 1,
	'(a) the others named it by SHA1, each once: none was sent again after NOSCRIPT');
# One refund call after another took 8.8 s here before: now Redis running the
# 100000 refunds is most of it.
cmp_ok($secs, '<', 6, '(a) the ROLLBACK took less than 6 s (one call each took 8.8 s)');
my $spot = level_count('te.many_up', 'tenant_', 100, $many, $many_capacity);
is($spot, '1000|1000', '(a) every bucket looked at (1 in 100) is full again');
is(level_count('te.many_up', 'tenant_', 1, 3, $many_capacity), '3|3', '(a) so are the first three');
is(peek('te.many_up', "tenant_$many"), "t|$many_capacity|redis", '(a) and the last one');
my @lost = loss_lines(log_since($node, $offset));
is_deeply(\@lost, [], '(a) no "not refunded" line in the log') or diag explain \@lost;
is($up->query_ok('SELECT now() = statement_timestamp()'), 't', '(a) the session is out of its transaction');
$up->quit;

##
## (4d) 30 reservations behind a 200 ms round trip: ROLLBACK costs one round trip.
##

$offset = log_offset($node);
($secs, $out, $err) = timed(sub { $far->query('ROLLBACK', 60) });
note sprintf('(d) ROLLBACK of %d reservations through a 200 ms round trip: %.3f s', $far_count, $secs);
is($err, '', '(d) the ROLLBACK raised nothing');
cmp_ok($secs, '<', 0.6, '(d) the ROLLBACK took less than two round trips (0.6 s)');
cmp_ok($secs, '>=', 0.19, '(d) and at least one: it did go through the proxy');
is(level_count('te.far', 'far_', 1, $far_count, $far_capacity), "$far_count|$far_count",
	'(d) all 30 buckets are full again');
@lost = loss_lines(log_since($node, $offset));
is_deeply(\@lost, [], '(d) no "not refunded" line in the log') or diag explain \@lost;
$far->quit;
$proxy->stop;

##
## (4b) 100000 reservations, Redis paused, command_timeout 1 s: ROLLBACK returns
##      within 1 s + 1 s, raises nothing, and logs one line for them all.
##

$offset = log_offset($node);
$redis->pause;
($secs, $out, $err) = timed(sub { $paused->query('ROLLBACK', 60) });
note sprintf('(b) ROLLBACK of %d reservations, Redis paused, command_timeout 1 s: %.3f s', $many, $secs);
cmp_ok($secs, '<', 2, '(b) the ROLLBACK returned within command_timeout + 1 s');
cmp_ok($secs, '>=', 0.95, '(b) after waiting for Redis about command_timeout');
is($err, '', '(b) the ROLLBACK raised nothing (no ERROR, no WARNING)');
is($paused->query_ok('SELECT now() = statement_timestamp()'), 't',
	'(b) the session is out of its transaction and usable');
ok(wait_for_log($node, qr/may not have been refunded/, $offset), '(b) the lost refunds are logged');
my $log = log_since($node, $offset);
@lost = loss_lines($log);
is_deeply(
	\@lost,
	[ grep { /LOG:  ratelimit: $many reservations may not have been refunded: Redis did not answer within ratelimit.command_timeout$/ } @lost ],
	'(b) every loss line is the one expected')
  or diag explain \@lost;
is(scalar @lost, 1,
	"(b) exactly one line: '$many reservations may not have been refunded: Redis did not answer within ratelimit.command_timeout'")
  or diag explain \@lost;
like($log, qr/may not have been refunded: .*\n.*DETAIL:  Policies: "te\.many_paused" \($many\)\./,
	'(b) its detail names the policy and the count');
unlike($log, qr/tenant_|rl:postgres/, '(b) the log names no subject and no key');
$redis->resume;
$paused->quit;
wait_for_redis('after (b)');
# What Redis had received before the deadline runs once it wakes up: never more
# than capacity, never less than what was reserved.
my ($refunded, $looked) = split /\|/, level_count('te.many_paused', 'tenant_', 100, $many, $many_capacity);
my ($spent) = split /\|/, level_count('te.many_paused', 'tenant_', 100, $many, $many_capacity - 1);
is($refunded + $spent, $looked,
	'(b) each bucket looked at (1 in 100) holds capacity - 1 (refund lost) or capacity (refunded once)');
note "(b) after Redis woke up, $refunded of the $looked buckets looked at had their refund after all";

##
## (4c) pg_terminate_backend during such a rollback (Redis paused, command_timeout
##      3 s): the backend is gone within 3 s + 1 s of the terminate.
##

$offset = log_offset($node);
my $term_pid = $term->pid;
$redis->pause;
my $rollback_start = time;
$term->start_query('ROLLBACK');
# The backend waits for Redis (wait event Extension) in its ROLLBACK.
my $waiting = 0;
while (time < $rollback_start + 2.5)
{
	if ($node->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE pid = $term_pid AND state = 'active'"
			  . " AND query LIKE 'ROLLBACK%' AND wait_event_type = 'Extension'") eq '1')
	{
		$waiting = 1;
		last;
	}
	usleep(20_000);
}
ok($waiting, '(c) the backend is in its ROLLBACK, waiting for Redis');
my $terminate_at = time;
note sprintf('(c) pg_terminate_backend sent %.3f s after the ROLLBACK started', $terminate_at - $rollback_start);
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($term_pid)"), 't',
	'(c) pg_terminate_backend accepted');
my $gone_at;
while (time < $terminate_at + 15)
{
	if ($node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE pid = $term_pid") eq '0')
	{
		$gone_at = time;
		last;
	}
	usleep(20_000);
}
ok(defined $gone_at, '(c) the terminated backend is gone');
$gone_at //= time;
note sprintf('(c) backend gone %.3f s after pg_terminate_backend (%.3f s after the ROLLBACK started)',
	$gone_at - $terminate_at, $gone_at - $rollback_start);
cmp_ok($gone_at - $terminate_at, '<', 1, '(c) gone within 1 s of the terminate: it does not wait for command_timeout (3 s)');
$redis->resume;
ok(backend_gone($node, $term_pid), '(c) backend_gone agrees');
$log = log_since($node, $offset);
like($log, qr/terminating connection due to administrator command/, '(c) the log shows the termination');
@lost = loss_lines($log);
is_deeply(\@lost,
	[ grep { /ratelimit: $many reservations may not have been refunded: the backend was terminated before Redis answered$/ } @lost ],
	'(c) every loss line is the one expected: the terminate ended the wait')
  or diag explain \@lost;
is(scalar @lost, 1, '(c) the rollback it was in logged its loss once, for all of them');
unlike($log, qr/TRAP|PANIC|server process .* terminated by signal/, '(c) no crash');
$term->quit;
wait_for_redis('after (c)');

###
### (5) An idle connection across a Redis restart: the next decision of the same
###     session opens it again and is answered by Redis.
###

my $idle = session($node);
my $idle_pid = $idle->pid;
my $d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{allowed}|$d->{remaining}|$d->{source}|$d->{stderr}", 't|999|redis|',
	'(5) a persistent session decides once: its connection to Redis is open');

my $redis_pid = $redis->pid;
$redis->kill9;
$redis->start;
isnt($redis->pid, $redis_pid, '(5) redis-server was killed (SIGKILL) and started again on the same port');
$d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{allowed}|$d->{remaining}|$d->{source}", 't|999|redis',
	'(5) after SIGKILL and a restart, the next rl_consume is answered by the new Redis (an empty bucket)');
is($d->{stderr}, '', '(5) and raises nothing');

$redis->stop;
$redis->start;
$d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{allowed}|$d->{remaining}|$d->{source}", 't|999|redis',
	'(5) after a clean stop and start, the next rl_consume is answered by Redis');
is($d->{stderr}, '', '(5) and raises nothing');

$d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{remaining}|$d->{source}", '998|redis', '(5) the connection is idle again');
my $killed = $redis->cli('CLIENT', 'KILL', 'TYPE', 'normal');
cmp_ok($killed, '>=', 1, "(5) CLIENT KILL TYPE normal closed $killed connection(s)");
$d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{allowed}|$d->{remaining}|$d->{source}", 't|997|redis',
	'(5) after CLIENT KILL, the next rl_consume is answered by Redis');
is($d->{stderr}, '', '(5) and raises nothing');
is($idle->pid, $idle_pid, '(5) all in the same backend');

# A request that Redis may have run goes to the fail mode: Redis paused while
# the request is out, command_timeout 300 ms.
$idle->query_ok("SET ratelimit.command_timeout = '300ms'");
$redis->pause;
($secs, $d) = timed(sub { $idle->consume('te.idle', 'idle_subject', 1) });
$redis->resume;
note sprintf('(5) rl_consume with Redis paused, command_timeout 300 ms: %.3f s, source %s',
	$secs, $d->{source} // '');
is("$d->{allowed}|$d->{source}", 'f|fail_closed',
	"(5) a request sent to a paused Redis times out to the fail mode ('closed': denied)");
cmp_ok($secs, '<', 1.3, '(5) within command_timeout + 1 s');
note '(5) its stderr: ' . ($d->{stderr} eq '' ? '(none)' : $d->{stderr});
$idle->query_ok('RESET ratelimit.command_timeout');
ok( $node->poll_query_until(
		'postgres', "SELECT source = 'redis' FROM rl_peek('te.idle', 'probe')"),
	'(5) Redis decides again once it is resumed');
$d = $idle->consume('te.idle', 'idle_subject', 1);
is("$d->{source}|$d->{stderr}", 'redis|', '(5) the same session is answered by Redis again');
$idle->quit;

###
### (7) Session leases behind a pooler.
###

##
## (7a) DISCARD ALL gives back the session's session-scope leases.
##

$offset = log_offset($node);
my $pooled = session($node);
is($pooled->query_ok("SELECT allowed, remaining, source FROM rl_acquire('te.pool', 'pool_a', 'session')"),
	't|0|redis', '(7a) a session-scope lease is taken');
is(peek('te.pool', 'pool_a'), 'f|0|redis', '(7a) another session sees it held');
($out, $err) = $pooled->query('DISCARD ALL');
is($err, '', '(7a) DISCARD ALL raises nothing');
is(peek('te.pool', 'pool_a'), 't|1|redis', '(7a) after DISCARD ALL, the lease is free again (remaining = capacity)');
is($pooled->query_ok("SELECT rl_release('te.pool', 'pool_a')"), 'f',
	'(7a) rl_release finds nothing left to give back');

# DISCARD ALL cannot run in a transaction block: it gives nothing back there.
is($pooled->query_ok("SELECT allowed, remaining, source FROM rl_acquire('te.pool', 'pool_a', 'session')"),
	't|0|redis', '(7a) a session-scope lease is taken again');
$pooled->query_ok('BEGIN');
is($pooled->query_ok("SELECT allowed, remaining, source FROM rl_acquire('te.pool_tx', 'pool_t')"),
	't|0|redis', '(7a) and, in a transaction, a transaction-scope lease');
$pooled->query_ok('SAVEPOINT s');
($out, $err) = $pooled->query('DISCARD ALL');
is(sqlstate_of($err), '25001', '(7a) DISCARD ALL inside a transaction block fails (25001)');
like($err, qr/DISCARD ALL cannot run inside a transaction block/, '(7a) with its usual message');
is(peek('te.pool', 'pool_a'), 'f|0|redis', '(7a) the session-scope lease is kept');
is(peek('te.pool_tx', 'pool_t'), 'f|0|redis', '(7a) the transaction-scope lease is kept');
$pooled->query_ok('ROLLBACK TO SAVEPOINT s');
is(peek('te.pool_tx', 'pool_t'), 'f|0|redis',
	'(7a) the transaction-scope lease is still held after ROLLBACK TO SAVEPOINT (it is older)');
# Without a savepoint the failed DISCARD ALL aborts the transaction: that
# releases the transaction's lease (as any error would), not the session's.
$pooled->query_ok('RELEASE SAVEPOINT s');
($out, $err) = $pooled->query('DISCARD ALL');
is(sqlstate_of($err), '25001', '(7a) DISCARD ALL fails again, now outside any savepoint');
is(peek('te.pool', 'pool_a'), 'f|0|redis', '(7a) the session-scope lease is still kept');
is(peek('te.pool_tx', 'pool_t'), 't|1|redis',
	'(7a) the aborted transaction gave its own lease back');
$pooled->query_ok('ROLLBACK');
is(peek('te.pool', 'pool_a'), 'f|0|redis', '(7a) the ROLLBACK keeps the session-scope lease');
($out, $err) = $pooled->query('DISCARD ALL');
is($err, '', '(7a) DISCARD ALL outside a transaction block');
is(peek('te.pool', 'pool_a'), 't|1|redis', '(7a) gives the session-scope lease back');
$pooled->quit;
@lost = loss_lines(log_since($node, $offset));
is_deeply(\@lost, [], '(7a) no "not released" line in the log') or diag explain \@lost;

##
## (7b) A real PgBouncer in session pooling mode, server_reset_query = DISCARD
##      ALL, one server connection: the lease a client took with scope 'session'
##      is free for the next client of the same backend.
##

SKIP:
{
	my ($pgbouncer) = grep { -x $_ } map { "$_/pgbouncer" } split(/:/, $ENV{PATH}), '/usr/sbin', '/usr/bin';
	skip 'pgbouncer is not installed (dev/lib.sh installs the Debian package pgbouncer)', 11
	  unless $pgbouncer;

	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $user = getpwuid($<);
	my $bouncer_log = "$dir/pgbouncer.log";
	append_to_file("$dir/userlist.txt", qq{"$user" ""\n});
	append_to_file(
		"$dir/pgbouncer.ini", join("\n",
			'[databases]',
			'postgres = host=' . $node->host . ' port=' . $node->port . ' dbname=postgres',
			'[pgbouncer]',
			'listen_addr = 127.0.0.1',
			"listen_port = $port",
			"unix_socket_dir =",
			'auth_type = trust',
			"auth_file = $dir/userlist.txt",
			'pool_mode = session',
			'server_reset_query = DISCARD ALL',
			'default_pool_size = 1',
			'max_db_connections = 1',
			'max_client_conn = 10',
			"logfile = $bouncer_log",
			"pidfile = $dir/pgbouncer.pid",
			''));
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', "$dir/pgbouncer.out");
		open(STDERR, '>&', \*STDOUT);
		exec($pgbouncer, "$dir/pgbouncer.ini") or POSIX::_exit(127);
	}
	# Killed at END too, should the test die before the end of this section.
	RateLimitTest::_register_child($pid);

	# psql through PgBouncer: one client connection, (status, stdout, stderr).
	my $through = sub {
		my ($sql) = @_;
		return RateLimitTest::run_with_timeout(
			[ 'psql', '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
			  '-h', '127.0.0.1', '-p', $port, '-d', 'postgres', '-c', $sql ], 30);
	};
	# Ends pgbouncer (TERM, then KILL), unless it has exited already; a pid
	# once reaped is never signalled (it may belong to another process by then).
	my $reaped = 0;
	my $stop_bouncer = sub {
		if (!$reaped)
		{
			kill 'TERM', $pid;
			my $until = time + 10;
			while (time < $until)
			{
				if (waitpid($pid, POSIX::WNOHANG()) == $pid)
				{
					$reaped = 1;
					last;
				}
				usleep(20_000);
			}
			if (!$reaped)
			{
				kill 'KILL', $pid;
				waitpid($pid, 0);
				$reaped = 1;
			}
		}
		RateLimitTest::_forget_child($pid);
	};
	my $listening = 0;
	my $deadline = time + 15;
	while (time < $deadline)
	{
		my ($status) = $through->('SELECT 1');
		if ($status == 0)
		{
			$listening = 1;
			last;
		}
		if (waitpid($pid, POSIX::WNOHANG()) == $pid)
		{
			$reaped = 1;
			last;
		}
		usleep(50_000);
	}
	if (!$listening)
	{
		diag 'pgbouncer output: ' . (-e "$dir/pgbouncer.out" ? slurp_file("$dir/pgbouncer.out") : '');
		diag 'pgbouncer log: ' . (-e $bouncer_log ? slurp_file($bouncer_log) : '');
		$stop_bouncer->();
		skip 'pgbouncer could not be started here', 11;
	}
	note "(7b) PgBouncer listens on 127.0.0.1:$port, server " . $node->host . ':' . $node->port;

	my ($status, $out1, $err1) = $through->(
		"SELECT pg_backend_pid(); SELECT allowed, remaining, source FROM rl_acquire('te.bouncer', 'bouncer_b', 'session')");
	is($status, 0, '(7b) client 1 ran through PgBouncer') or diag $err1;
	my ($pid1, $decision1) = split /\n/, $out1;
	is($decision1, 't|0|redis', '(7b) client 1 took the session-scope lease, then disconnected');
	my $pid1_sql = defined $pid1 && $pid1 =~ /^\d+$/ ? $pid1 : 0;
	ok( $node->poll_query_until(
			'postgres',
			"SELECT query = 'DISCARD ALL' AND state = 'idle' FROM pg_stat_activity WHERE pid = $pid1_sql"),
		'(7b) PgBouncer ran its server_reset_query, DISCARD ALL, on the server connection client 1 left');
	# Client 1 is gone; PgBouncer runs DISCARD ALL on the server connection
	# before it hands it to client 2 (who waits for it: pool size 1).
	my ($status2, $out2, $err2) = $through->(
		"SELECT pg_backend_pid(); SELECT allowed, remaining, source FROM rl_peek('te.bouncer', 'bouncer_b')");
	is($status2, 0, '(7b) client 2 ran through PgBouncer') or diag $err2;
	my ($pid2, $decision2) = split /\n/, $out2;
	ok(defined $pid1 && $pid1 =~ /^\d+$/, '(7b) client 1 saw its backend pid');
	is($pid2, $pid1, '(7b) client 2 got the same server connection (the same backend)');
	is($decision2, 't|1|redis', '(7b) client 2 sees the lease free: DISCARD ALL gave it back');
	is(peek('te.bouncer', 'bouncer_b'), 't|1|redis', '(7b) so does a session on the node itself');
	is($node->safe_psql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE pid = $pid1"), '1',
		'(7b) the backend is still there (the lease did not go back with a backend exit)');
	my $bouncer_log_text = -e $bouncer_log ? slurp_file($bouncer_log) : '';
	unlike($bouncer_log_text, qr/ERROR|FATAL/, '(7b) PgBouncer logged no error');

	$stop_bouncer->();
	ok($reaped, '(7b) PgBouncer was stopped');
}

###
### (4e) 20000 session-scope leases in one backend, then a fast shutdown with
###      Redis paused: it completes within command_timeout + 3 s. Last: it stops
###      the node.
###

my $lease_timeout_s = 2;
my $holder = session($node, options => "-c ratelimit.command_timeout=${lease_timeout_s}s");
($secs, $out, $err) = timed(sub {
	$holder->query(sprintf(
		# The subject refers to g (and is always 'lease_holder'): with constant
		# arguments the function would be called once and its row rescanned.
		"SELECT count(*) FROM generate_series(1, %d) g, LATERAL rl_acquire('te.leases', 'lease_holder' || left(g::text, 0), 'session') r WHERE r.allowed",
		$lease_count), 180) });
is("$out$err", $lease_count, "(e) one backend holds $lease_count session-scope leases");
note sprintf('(e) taking %d session-scope leases took %.3f s', $lease_count, $secs);
is(peek('te.leases', 'lease_holder'), 'f|0|redis', '(e) all of them are held in Redis');

$offset = log_offset($node);
$redis->pause;
($secs) = timed(sub { $node->stop('fast') });
note sprintf('(e) pg_ctl stop -m fast with %d session leases, Redis paused, command_timeout %d s: %.3f s',
	$lease_count, $lease_timeout_s, $secs);
cmp_ok($secs, '<', $lease_timeout_s + 3, '(e) the fast shutdown completed within command_timeout + 3 s');
$redis->resume;
$log = log_since($node, $offset);
@lost = loss_lines($log);
is_deeply(\@lost,
	[ grep { /LOG:  ratelimit: $lease_count leases may not have been released: Redis did not answer within ratelimit.command_timeout$/ } @lost ],
	'(e) the loss is logged once for all leases')
  or diag explain \@lost;
is(scalar @lost, 1, "(e) one line: '$lease_count leases may not have been released: ...'") or diag $log;
like($log, qr/leases may not have been released: .*\n.*DETAIL:  Policies: "te\.leases" \($lease_count\)\./,
	'(e) its detail names the policy and the count');
$holder->quit;
# What Redis had received before the deadline runs once it wakes up.
my ($lease_key) = grep { /:\{lease_holder\}:te\.leases\z/ } $redis->scan_keys;
ok(defined $lease_key, "(e) the lease set is in Redis");
my ($held, $previous) = (-1, -2);
my $settle_deadline = time + 5;
while ($held != $previous && time < $settle_deadline)
{
	usleep(100_000);
	$previous = $held;
	$held = $lease_key ? $redis->cli('ZCARD', $lease_key) : 0;
}
note "(e) after Redis woke up, $held of the $lease_count leases are still held (until idle_ttl)";
cmp_ok($held, '<=', $lease_count, '(e) never more leases than were taken');

$log = slurp_file($node->logfile);
unlike($log, qr/TRAP|PANIC/, 'no assertion failure, no PANIC');
unlike($log, qr/tenant_|far_|idle_subject|pool_a|pool_t|bouncer_b|lease_holder/,
	'the log never names a subject');

done_testing();
