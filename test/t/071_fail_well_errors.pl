
# Failing well, the quiet cases: Redis answers, but with an error (out of
# memory, a bucket of the wrong type, a wrong password, a password missing);
# the fail mode decides, nothing is raised, the log names the policy and the
# error class, never the subject, and the breaker stays closed where Redis
# answered. Also: a host name in the URL, who may read rl_health(), a server
# without shared_preload_libraries, and a probe that ends without evidence
# handing the probe on (see the end).

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $retry_ms = 200;
my $redis = redis_start(name => 'errors');
my $node = rl_node('errors', redis => $redis,
	conf => ["ratelimit.retry_interval = '${retry_ms}ms'"]);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('e_open', 1000, 1000, '1 day', 'open'),
	  ('e_closed', 1000, 1000, '1 day', 'closed'),
	  ('e_local', 1000, 1000, '1 day', 'local');
	CREATE ROLE rl_mon LOGIN;
	GRANT pg_monitor TO rl_mon;
	CREATE ROLE rl_plain LOGIN;
});

# A subject that must never reach the server log.
my $subject = 'subj_err_q7x';

# Checks that decision d came from policy's fail mode, without error.
sub is_fail_mode
{
	my ($d, $policy, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my %want = (
		e_open => [ 't', 'fail_open' ],
		e_closed => [ 'f', 'fail_closed' ],
		e_local => [ 't', 'local' ]);
	is_deeply([ @$d{qw(allowed source stderr)} ], [ @{ $want{$policy} }, '' ],
		"$name: $policy decided by its fail mode, no error")
	  or diag explain $d;
}

# True when the log after offset has, from backend pid, the LOG line "Redis
# cannot answer (<class>)" with class matching class_re, followed by its DETAIL
# naming policy.
sub logged_failure
{
	my ($offset, $pid, $class_re, $policy) = @_;
	my @lines = split /\n/, log_since($node, $offset);
	for my $i (0 .. $#lines - 1)
	{
		next
		  unless $lines[$i] =~
		  /\[$pid\].*\bLOG:\s+ratelimit: Redis (?:cannot answer|refuses to serve without the right password) \((.*)\)$/;
		my $class = $1;
		return 1
		  if $class =~ $class_re
		  && $lines[ $i + 1 ] =~ /\[$pid\].*\bDETAIL:\s+Policy "\Q$policy\E" decides by its fail mode/;
	}
	return 0;
}

###
### A host name in the URL.
###

{
	my $s = session($node);
	$s->query_ok('SET ratelimit.redis_url = '
		  . quote_literal('redis://localhost:' . $redis->port));
	my $d = $s->consume('e_closed', 'host_subject');
	is_deeply([ @$d{qw(source allowed remaining stderr)} ],
		[ 'redis', 't', 999, '' ], 'redis://localhost:port: Redis decides')
	  or diag explain $d;
	ok((grep { /\{host_subject\}/ } $redis->scan_keys), 'the bucket is in that Redis');
	is($s->consume('e_closed', 'host_subject')->{remaining},
		998, 'and the next decision too (the address is cached)');
	$s->quit;
}

###
### A URL of one's own (ALTER ROLE ... SET, or SET): a breaker of one's own.
### The server-wide breaker belongs to the server's Redis only.
###

{
	my $dead_port = PostgreSQL::Test::Cluster::get_free_port();
	$node->safe_psql(
		'postgres', qq{
		CREATE ROLE rl_app LOGIN;
		GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_health() TO rl_app;
		ALTER ROLE rl_app SET ratelimit.redis_url = 'redis://127.0.0.1:$dead_port';
	});
	my $app = session($node, user => 'rl_app');
	my $other = session($node);
	is_fail_mode($app->consume('e_closed', 'app_subject'), 'e_closed',
		'a role whose URL points at nothing');
	my ($elapsed, $d) = timed(sub { $app->consume('e_open', 'app_subject') });
	is($d->{source}, 'fail_open', 'its next decision: the fail mode');
	my $h = health($app);
	is_deeply([ @$h{qw(shared breaker redis_reachable last_error)} ],
		[ 'f', 'open', 'f', 'connect: Connection refused' ],
		'the role has a breaker of its own, open')
	  or diag explain $h;
	$h = health($other);
	is_deeply([ @$h{qw(shared breaker)} ], [ 't', 'closed' ],
		'the server-wide breaker stays closed')
	  or diag explain $h;
	is($other->consume('e_closed', 'app_subject')->{source},
		'redis', 'and other sessions are decided by Redis');
	$app->quit;
	$other->quit;
}

###
### Who may read rl_health().
###

{
	my $mon = session($node, user => 'rl_mon');
	my $h = health($mon);
	is_deeply([ @$h{qw(breaker shared local_buckets)} ],
		[ 'closed', 't', 10000 ],
		'a member of pg_monitor reads rl_health(): breaker closed, shared, 10000 slots')
	  or diag explain $h;
	my $plain = session($node, user => 'rl_plain');
	my ($out, $err) = $plain->query('SELECT * FROM rl_health()');
	is(sqlstate_of($err), '42501', 'a plain role may not (42501)');
	is($out, '', 'and sees nothing');
	$mon->quit;
	$plain->quit;
}

###
### Error replies from a Redis that answers: they do not trip the breaker.
###

# The decisions of the three policies in a new session, with checks; returns
# the session's backend pid and the log offset before the decisions.
sub error_case
{
	my ($case, $setup) = @_;
	my $s = session($node);
	$s->query_ok($setup) if $setup;
	my $offset = log_offset($node);
	for my $policy (qw(e_open e_closed e_local))
	{
		is_fail_mode($s->consume($policy, $subject), $policy, $case);
	}
	return ($s, $offset);
}

my $errors_offset = log_offset($node);

# WRONGTYPE: the bucket keys of the subject overwritten by lists.
$node->safe_psql('postgres',
	"SELECT rl_consume(p, '$subject') FROM unnest(ARRAY['e_open', 'e_closed', 'e_local']) p");
my @keys = grep { /\{\Q$subject\E\}/ } $redis->scan_keys;
is(scalar @keys, 3, 'one bucket key per policy');
$redis->cli('DEL', $_) for @keys;
$redis->cli('RPUSH', $_, 'not a bucket') for @keys;
my ($s, $offset) = error_case('WRONGTYPE');
ok(logged_failure($offset, $s->pid, qr/^error reply: WRONGTYPE$/, 'e_open'),
	'WRONGTYPE: the log names the policy and the error class');
my $h = health($s);
is_deeply([ @$h{qw(breaker redis_reachable shared)} ], [ 'closed', 't', 't' ],
	'WRONGTYPE: the breaker stays closed (Redis answered)')
  or diag explain $h;
is($s->consume('e_closed', 'other_subject')->{source},
	'redis', 'WRONGTYPE: another subject is still decided by Redis');
$s->quit;
$redis->cli('DEL', $_) for @keys;

# OOM: every write refused.
$redis->cli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
$redis->cli('CONFIG', 'SET', 'maxmemory', '1');
($s, $offset) = error_case('OOM');
ok(logged_failure($offset, $s->pid, qr/^oom: OOM$/, 'e_open'),
	'OOM: the log names the policy and the error class (oom, since 0.5.0)');
$h = health($s);
is_deeply([ @$h{qw(breaker redis_reachable)} ], [ 'closed', 't' ],
	'OOM: the breaker stays closed (Redis answered)')
  or diag explain $h;
is($h->{last_error}, 'oom: OOM', 'rl_health() shows the last error');
$redis->cli('CONFIG', 'SET', 'maxmemory', '0');
my $d = $s->consume('e_closed', $subject);
is_deeply([ @$d{qw(source allowed remaining)} ], [ 'redis', 't', 999 ],
	'memory back: Redis decides at once (nothing to wait for)')
  or diag explain $d;
$s->quit;

# Authentication, in sessions with their own URL (and so their own breaker).
my $password = 'pw-err-5Tq';
my $auth = redis_start(name => 'errors_auth', password => $password);

# A wrong password: AUTH fails while connecting (class authentication, since 0.9.0):
# the session's breaker opens.
($s, $offset) = error_case('WRONGPASS',
	'SET ratelimit.redis_url = ' . quote_literal($auth->url(userinfo => 'default:wrong-pw-8')));
ok(logged_failure($offset, $s->pid, qr/^authentication: WRONGPASS$/, 'e_open'),
	'wrong password: the log names the policy and WRONGPASS');
$h = health($s);
is_deeply([ @$h{qw(breaker redis_reachable shared last_error)} ],
	[ 'open', 'f', 'f', 'authentication: WRONGPASS' ],
	'wrong password: the session\'s own breaker is open')
  or diag explain $h;
$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($auth->url(userinfo => "default:$password")));
is($s->consume('e_closed', $subject)->{source}, 'redis',
	'the right password: Redis decides at once (a new URL, a new breaker)');
$s->quit;

# No password where one is required: Redis answers NOAUTH to the script. Every call
# would: the Redis is unhealthy for this server, and the log says what fixes it.
($s, $offset) = error_case('NOAUTH',
	'SET ratelimit.redis_url = ' . quote_literal($auth->url));
ok(logged_failure($offset, $s->pid, qr/^authentication: NOAUTH$/, 'e_open'),
	'no password: the log names the policy and NOAUTH');
like(log_since($node, $offset), qr/HINT:  Write the password of the Redis user in the file ratelimit\.redis_password_file names/,
	'no password: the log line says ratelimit.redis_password_file is the fix');
$h = health($s);
is_deeply([ @$h{qw(breaker redis_reachable last_error)} ], [ 'open', 'f', 'authentication: NOAUTH' ],
	'no password: rl_health() says Redis is not reachable, the breaker open')
  or diag explain $h;
$s->quit;
$auth->stop;

my $log = log_since($node, $errors_offset);
unlike($log, qr/\Q$subject\E/, 'the log never names the subject');
unlike($log, qr/\Q$password\E|wrong-pw-8/, 'nor a password');
unlike($log, qr/rl:postgres:/, 'nor a key');
unlike($log, qr/\bERROR:/, 'no ERROR at all') or diag $log;

###
### Any role may SET a shorter command_timeout: its own timeouts do not open the
### server-wide breaker, or one role could make every session fail open or closed.
###
{
	my $a = session($node);
	my $b = session($node);
	is($b->consume('e_closed', 'short_subject')->{source}, 'redis', 'short deadline: Redis decides');
	$a->query_ok("SET ratelimit.command_timeout = '50ms'");
	$redis->pause;
	is($a->consume('e_closed', 'short_subject')->{source}, 'fail_closed',
		'Redis frozen: the session with a 50 ms deadline times out');
	$redis->resume;
	my $h = health($b);
	is_deeply([ @$h{qw(shared breaker)} ], [ 't', 'closed' ],
		'a timeout shorter than the server\'s leaves the server-wide breaker closed')
	  or diag explain $h;
	is($b->consume('e_closed', 'short_subject')->{source}, 'redis', 'other sessions still ask Redis');
	$a->quit;
	$b->quit;
}

###
### A probe that ends without evidence hands the probe on at once.
###
### The breaker claims a probe by moving open_until_us to the probe's own
### deadline (connect_timeout + command_timeout of the probing session). A probe
### cancelled by statement_timeout or pg_cancel_backend, or one that finds its
### connection cut, must give the claim back, or the server-wide breaker would
### stay open for that whole deadline (any role can set it to 120 s) though
### Redis answers again.
###

# Polls decisions of policy e_closed in session s for at most seconds; returns
# (seconds until Redis decided or undef, the last decision).
sub time_to_redis
{
	my ($s, $seconds) = @_;
	my $start = time;
	my $d;
	while (time < $start + $seconds)
	{
		$d = $s->consume('e_closed', 'probe_subject');
		return (time - $start, $d) if $d->{source} eq 'redis';
		usleep(20_000);
	}
	return (undef, $d);
}

{
	my $a = session($node);
	my $b = session($node);
	is($a->consume('e_closed', 'probe_subject')->{source}, 'redis', 'probe tests: Redis decides');
	is($b->consume('e_closed', 'probe_subject')->{source}, 'redis', 'in both sessions');

	# (1) A cancelled probe.
	$a->query_ok("SET ratelimit.command_timeout = '300ms'");
	$redis->pause;
	is($a->consume('e_closed', 'probe_subject')->{source}, 'fail_closed',
		'Redis frozen: a timeout, the breaker opens');
	usleep(($retry_ms + 50) * 1000);
	$a->query_ok("SET ratelimit.command_timeout = '2s'; SET statement_timeout = '400ms'");
	my ($elapsed, $cancelled) = timed(sub { $a->consume('e_closed', 'probe_subject') });
	is(sqlstate_of($cancelled->{stderr}), '57014', 'the probe is cancelled by statement_timeout');
	$a->query_ok("RESET statement_timeout; RESET ratelimit.command_timeout");
	$redis->resume;
	my ($took, $last) = time_to_redis($b, $retry_ms / 1000 + 1);
	note 'after a cancelled probe and Redis back: '
	  . (defined $took ? sprintf('Redis decided after %.3f s', $took)
		: "still $last->{source} after 1.2 s, retry_after_ms $last->{retry_after_ms}");
	ok(defined $took, 'after a cancelled probe, Redis decides again within retry_interval + 1 s');

	# (2) A probe that finds its connection cut.
	$redis->kill9;
	is($a->consume('e_closed', 'probe_subject')->{source}, 'fail_closed',
		'Redis killed: the fail mode decides');
	# The first call found its connection cut; this one has its connect refused.
	$a->consume('e_closed', 'probe_subject');
	$h = health($a);
	is($h->{breaker}, 'open', 'a refused connect opened the breaker') or diag explain $h;
	usleep(($retry_ms + 50) * 1000);
	$redis->start;
	# b still holds its connection to the killed server: its probe finds it closed before
	# writing, and opens a new one within the same call.
	$b->query_ok("SET ratelimit.command_timeout = '2s'");
	my $probe = $b->consume('e_closed', 'probe_subject');
	is($probe->{source}, 'redis', 'the probe over a connection Redis closed opens a new one: Redis decides');
	$h = health($a);
	note "after that probe: breaker $h->{breaker}, reachable $h->{redis_reachable}, "
	  . "retry_in_ms $h->{retry_in_ms}, last error $h->{last_error}";
	($took, $last) = time_to_redis($a, $retry_ms / 1000 + 1);
	note 'after a probe over a cut connection, Redis up: '
	  . (defined $took ? sprintf('Redis decided after %.3f s', $took)
		: "still $last->{source} after 1.2 s, retry_after_ms $last->{retry_after_ms}");
	ok(defined $took, 'after a probe over a cut connection, Redis decides within retry_interval + 1 s');
	$a->quit;
	$b->quit;
}

###
### Without shared_preload_libraries: no local buckets, 'local' acts as 'closed'.
###

my $dead_port = PostgreSQL::Test::Cluster::get_free_port();
my $plain = rl_node(
	'no_preload',
	url => "redis://127.0.0.1:$dead_port",
	preload => 0,
	create_extension => 0);
is($plain->safe_psql('postgres', 'SHOW shared_preload_libraries'),
	'', 'this node does not preload ratelimit');
my ($ret, $out, $err) = $plain->psql('postgres', 'CREATE EXTENSION ratelimit');
# (ratelimit.local_buckets, a server-start setting, exists only when preloaded: defined
# later it would be FATAL.)
is($ret, 0, 'CREATE EXTENSION works without shared_preload_libraries') or diag $err;

{

	($ret, $out, $err) = $plain->psql('postgres',
		q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
		  VALUES ('np_local', 10, 10, '1 day', 'local'), ('np_open', 10, 10, '1 day', 'open')});
	is($ret, 0, 'a local policy can be created');
	like($err,
		qr/WARNING:\s+policy "np_local" falls back to closed, not local, while Redis cannot answer/,
		'with a WARNING that it falls back to closed');
	unlike($err, qr/np_open/, 'no WARNING for the open policy');
	my $ps = session($plain);
	my $d = $ps->consume('np_local', $subject);
	ok( $d->{source} eq 'fail_closed'
		  && $d->{allowed} eq 'f'
		  && $d->{retry_after_ms} > 0
		  && $d->{stderr} eq '',
		'Redis down: the local policy decides fail_closed, with a retry-after, no error')
	  or diag explain $d;
	is($ps->consume('np_open', $subject)->{source}, 'fail_open', 'the open policy fails open');
	($out, $err) = $ps->query(decision_sql('np_local', $subject, 1, 'rl_enforce'));
	is(sqlstate_of($err), 'RL503', 'rl_enforce on the local policy: RL503');
	my $h = health($ps);
	is_deeply([ @$h{qw(shared local_buckets local_buckets_in_use breaker redis_reachable)} ],
		[ 'f', 0, 0, 'open', 'f' ],
		'rl_health(): not shared, no local buckets, this backend\'s breaker open')
	  or diag explain $h;
	like($h->{last_error}, qr/^connect: Connection refused$/, 'rl_health(): the last error');
	$ps->quit;
	unlike(slurp_file($plain->logfile), qr/terminated by signal|TRAP:|PANIC:/,
		'no backend crashed on the node without preload');
	is($plain->safe_psql('postgres', 'SELECT _rl_local_available()'), 'f',
		'_rl_local_available() says so');

	# An allowance needs the slices in shared memory: rl_define says when there are none.
	($ret, $out, $err) = $plain->psql('postgres',
		q{SELECT rl_define('np_allowance', 10, per => '1 minute', allowance => 5)});
	is($ret, 0, 'a policy with an allowance can be defined');
	like($err, qr/WARNING:\s+policy "np_allowance" takes no slices: every decision asks Redis.*HINT:\s+Add ratelimit to shared_preload_libraries/s,
		'with a WARNING that it takes no slices, and what to do');
	($ret, $out, $err) = $plain->psql('postgres',
		q{UPDATE rl_policy SET allowance = 6 WHERE name = 'np_allowance'});
	unlike($err, qr/takes no slices/, 'once: not again when the allowance changes');
}
$plain->stop;

$log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* exited with exit code [^0]/,
	'no backend crashed');
unlike($log, qr/TRAP:|PANIC:/, 'no assertion failure or panic');
$node->stop;
$redis->stop;
done_testing();
