
# When Redis cannot answer, the policy's fail mode decides, no ERROR is raised,
# and the log says so once; when it answers again, decisions come from Redis
# again without anyone reconnecting by hand (once the breaker lets a probe
# through: ratelimit.retry_interval is short here). Also: scripts flushed,
# connections killed, bucket keys of the wrong type, authentication, a server
# that speaks no Redis, database numbers and unix sockets.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

# After a failure that means Redis cannot be reached, decisions skip Redis for
# retry_interval, then one probes it.
my $retry_ms = 200;
my $redis = redis_start(name => 'faults');
my $node = rl_node('faults', redis => $redis,
	conf => ["ratelimit.retry_interval = '${retry_ms}ms'"]);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('f_open', 1000, 1000, '1 day', 'open'),
	  ('f_closed', 1000, 1000, '1 day', 'closed'),
	  ('f_local', 1000, 1000, '1 day', 'local');
});

# A subject that must never reach the server log.
my $subject = 'subject_zq81';

# Checks that decision d came from fail mode mode of policy's kind.
sub is_fail_mode
{
	my ($d, $policy, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	if (!defined $d)
	{
		fail("$name: no decision");
		return;
	}
	if ($policy eq 'f_open')
	{
		is_deeply([ @$d{qw(allowed source retry_after_ms)} ],
			[ 't', 'fail_open', 0 ], "$name: allowed by fail mode open");
	}
	elsif ($policy eq 'f_local')
	{
		# The local bucket in shared memory decides (1000 tokens: all granted).
		ok( $d->{allowed} eq 't'
			  && $d->{source} eq 'local'
			  && $d->{retry_after_ms} == 0
			  && $d->{remaining} < 1000,
			"$name: allowed by the local bucket of $policy")
		  or diag explain $d;
	}
	else
	{
		ok( $d->{allowed} eq 'f'
			  && $d->{source} eq 'fail_closed'
			  && $d->{retry_after_ms} > 0
			  && $d->{remaining} == 0,
			"$name: denied by fail mode of $policy, retry_after_ms > 0")
		  or diag explain $d;
	}
}

# Checks that decision d came from Redis.
sub is_redis
{
	my ($d, $name, %expect) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my %want = (source => 'redis', %expect);
	$want{stderr} = '' if exists $d->{stderr};
	is_deeply({ map { $_ => $d->{$_} } keys %want }, \%want, $name)
	  or diag explain $d;
}

# Log lines of backend pid after offset that match regex.
sub log_lines
{
	my ($offset, $pid, $regex) = @_;
	return grep { /\[$pid\]/ && $_ =~ $regex } split /\n/, log_since($node, $offset);
}

# The LOG and DETAIL lines after offset (what the extension writes itself).
sub own_lines
{
	my ($offset) = @_;
	return join "\n", grep { /\b(?:LOG|DETAIL):/ } split /\n/, log_since($node, $offset);
}

###
### Redis killed, then started again on the same port.
###

# A session that had a working connection when Redis died.
my $long = session($node);
is_redis($long->consume('f_closed', $subject), 'before the crash, Redis decides',
	allowed => 't');

my $offset = log_offset($node);
$redis->kill9;

# A new session makes many decisions while Redis is down.
my $fresh = session($node);
for my $i (1 .. 4)
{
	for my $policy (qw(f_open f_closed f_local))
	{
		my $d = $fresh->consume($policy, $subject);
		my $err = $d->{stderr};
		is_fail_mode($d, $policy, "Redis down, call $i, $policy");
		is($d->{remaining}, 1000 - $i, "Redis down, call $i: the local bucket counts down")
		  if $policy eq 'f_local';
		is($err, '', "Redis down, call $i, $policy: no error or warning");
	}
}
my @cannot = log_lines($offset, $fresh->pid, qr/ratelimit: Redis cannot answer \(.+: .+\)/);
is(scalar @cannot, 1, 'a session logs "cannot answer" once, not once per call')
  or diag explain \@cannot;

# The older session still holds its connection to the dead server. Once the
# breaker lets a probe through, it finds that connection cut (logged once, as
# its own failure class), and it never raises an error.
usleep(($retry_ms + 50) * 1000);
for my $i (1 .. 3)
{
	my $d = $long->consume('f_closed', $subject);
	my $err = $d->{stderr};
	is_fail_mode($d, 'f_closed', "Redis down, older session, call $i");
	is($err, '', "Redis down, older session, call $i: no error");
}
my @long_cannot = log_lines($offset, $long->pid, qr/Redis cannot answer/);
ok(@long_cannot >= 1 && @long_cannot <= 2,
	'the older session logs the outage, at most once per kind of failure')
  or diag explain \@long_cannot;

# rl_enforce: open lets through, closed raises the "unavailable" error (an API's 503,
# not a quota 429).
my ($out, $err) = $fresh->query(decision_sql('f_open', 'enforce_1', 1, 'rl_enforce'));
is(parse_decision($out)->{source}, 'fail_open', 'rl_enforce with open: allowed');
($out, $err) = $fresh->query(decision_sql('f_closed', 'enforce_1', 1, 'rl_enforce'));
is(sqlstate_of($err), 'RL503', 'rl_enforce with closed: SQLSTATE RL503');
like($err, qr/rate limiter unavailable for policy "f_closed"/, 'saying the limiter is unavailable');
like($err, qr/DETAIL:\s+Retry after [1-9]\d* seconds?\./, 'with a retry-after');

my $log = log_since($node, $offset);
unlike(own_lines($offset), qr/\Q$subject\E/, 'the LOG and DETAIL lines never name the subject');
# ereport(LOG) from a backend is followed by the statement (log_min_error_statement
# is "error" by default, and LOG ranks above ERROR in the server log) unless the
# extension hides it: the statement carries the subject.
unlike($log, qr/\Q$subject\E/, 'the log never names the subject (not even in a STATEMENT line)');
unlike($log, qr/rl:postgres:/, 'the log never names a key');
unlike($log, qr/\bERROR:(?!.*(?:rate limit exceeded|rate limiter unavailable))/,
	'no ERROR but the rate limit ones');

# Same port, empty dataset: the backends reconnect by themselves, as soon as
# the breaker lets a probe through; until then the fail mode decides.
$offset = log_offset($node);
$redis->start;
my $restarted = time;
my ($back, @before_back);
while (time < $restarted + 10)
{
	my $d = $long->consume('f_closed', $subject);
	if ($d->{source} eq 'redis')
	{
		$back = $d;
		last;
	}
	push @before_back, $d;
	usleep(20_000);
}
my $recovery = time - $restarted;
note sprintf('Redis decided again %.3f s after the restart, after %d fail-mode decisions',
	$recovery, scalar @before_back);
ok(!(grep { $_->{source} ne 'fail_closed' || $_->{stderr} ne '' } @before_back),
	'until the probe, the fail mode decides, without errors')
  or diag explain \@before_back;
is_redis($back // {},
	'after the restart, the older session is decided by Redis again',
	allowed => 't', remaining => 999);
is_redis($fresh->consume('f_open', $subject),
	'and so is the newer one', allowed => 't', remaining => 999);
is(scalar(log_lines($offset, $long->pid, qr/ratelimit: Redis answers again/)),
	1, 'the log says Redis answers again');
is(scalar(log_lines($offset, $fresh->pid, qr/ratelimit: Redis answers again/)),
	1, 'once per session that had logged the failure');
$fresh->quit;

###
### Scripts flushed: EVALSHA gets NOSCRIPT, EVAL loads it again, once.
###

$redis->cli('SCRIPT', 'FLUSH');
$redis->cli('CONFIG', 'RESETSTAT');
is_redis($long->consume('f_closed', $subject), 'after SCRIPT FLUSH, Redis decides',
	allowed => 't', remaining => 998);
is($redis->command_calls('evalsha'), 1, 'EVALSHA was tried');
is($redis->command_calls('eval'), 1, 'then EVAL sent the script once');
is_redis($long->consume('f_closed', $subject), 'the next call too',
	remaining => 997);
is($redis->command_calls('evalsha'), 2, 'the next call uses EVALSHA');
is($redis->command_calls('eval'), 1, 'and needs no EVAL: the SHA1 matches the script');

###
### Our connection killed by Redis: at worst one fail-mode decision.
###

my $killed = $redis->cli('CLIENT', 'KILL', 'TYPE', 'normal');
cmp_ok($killed, '>=', 1, 'CLIENT KILL TYPE normal closed our connection');
my $first = $long->consume('f_closed', $subject);
my $first_err = $first->{stderr};
my $second = $long->consume('f_closed', $subject);
my $second_err = $second->{stderr};
ok($first->{source} eq 'redis' || $first->{source} eq 'fail_closed',
	'first call after the kill: Redis or the fail mode')
  or diag explain $first;
is($first_err . $second_err, '', 'no error after the kill');
is_redis($second, 'second call after the kill: Redis', allowed => 't');

###
### A bucket key of the wrong type, or corrupt: the fail mode decides.
###

$long->consume($_, 'wt_subject') for qw(f_open f_closed);
my @wt_keys = grep { /\{wt_subject\}/ } $redis->scan_keys;
is(scalar @wt_keys, 2, 'one key per policy for the subject');
$redis->cli('DEL', $_) for @wt_keys;
$redis->cli('RPUSH', $_, 'x') for @wt_keys;
$offset = log_offset($node);
for my $policy (qw(f_open f_closed))
{
	my $d = $long->consume($policy, 'wt_subject');
	my $e = $d->{stderr};
	is_fail_mode($d, $policy, "WRONGTYPE, $policy");
	is($e, '', "WRONGTYPE, $policy: no error");
}
ok(log_lines($offset, $long->pid, qr/Redis cannot answer \(error reply: WRONGTYPE\)/),
	'the log names the error reply');
unlike(own_lines($offset), qr/wt_subject/, 'but not the key');

for my $key (@wt_keys)
{
	$redis->cli('DEL', $key);
	$redis->cli('HSET', $key, 'level', '-5', 'time', '0');
}
for my $policy (qw(f_open f_closed))
{
	my $d = $long->consume($policy, 'wt_subject');
	my $e = $d->{stderr};
	is_fail_mode($d, $policy, "corrupt bucket, $policy");
	is($e, '', "corrupt bucket, $policy: no error");
}
$redis->cli('DEL', $_) for @wt_keys;
is_redis($long->consume('f_closed', 'wt_subject'), 'key deleted: Redis decides',
	allowed => 't', remaining => 999);

###
### Authentication.
###

my $password = 'pw-7Hq2xZ';
my $auth = redis_start(name => 'auth', password => $password);
$auth->cli('ACL', 'SETUSER', 'rluser', 'on', '>user-pw-9k', '~*', '+@all');

my $p = session($node);
my $subject_auth = 'auth_subject';

# Decisions in session p with redis_url set to url.
sub with_url
{
	my ($url, $policy, $subject) = @_;
	my ($set_out, $set_err) =
	  $p->query('SET ratelimit.redis_url = ' . quote_literal($url));
	die "could not set ratelimit.redis_url: $set_err" if $set_err ne '';
	return $p->consume($policy, $subject // $subject_auth);
}

$offset = log_offset($node);
my %bad_urls = (
	'no password' => $auth->url,
	'wrong password' => $auth->url(userinfo => 'wrong-pw-3'),
	'wrong password for default' => $auth->url(userinfo => 'default:wrong-pw-3'),
	'unknown user' => $auth->url(userinfo => "nobody:$password"),
	# A lone value is the user (CONTRACT: [user[:password]@]), its password from
	# ratelimit.redis_password_file: here none, so no AUTH, and NOAUTH.
	'the password written where the user goes' => $auth->url(userinfo => $password),);
foreach my $case (sort keys %bad_urls)
{
	for my $policy (qw(f_open f_closed))
	{
		my $d = with_url($bad_urls{$case}, $policy);
		my $e = $d->{stderr};
		is_fail_mode($d, $policy, "$case: $policy");
		is($e, '', "$case: $policy: no error");
	}
}
my %good_urls = (
	'user default and password' => $auth->url(userinfo => "default:$password"),
	'empty user and password (the password alone)' => $auth->url(userinfo => ":$password"),
	'ACL user' => $auth->url(userinfo => 'rluser:user-pw-9k'),
	'unix socket, password' => $auth->unix_url(userinfo => "default:$password"),);
my $remaining = 1000;
foreach my $case (sort keys %good_urls)
{
	$remaining--;
	is_redis(with_url($good_urls{$case}, 'f_closed'),
		"$case: Redis decides", allowed => 't', remaining => $remaining);
}
ok(grep({ /\{$subject_auth\}/ } $auth->scan_keys),
	'the bucket is in the server that requires a password');
$log = log_since($node, $offset);
unlike($log, qr/\Q$password\E|wrong-pw-3|user-pw-9k/, 'no password in the log');
unlike(own_lines($offset), qr/\Q$subject_auth\E/, 'no subject in the lines the extension logs');
$auth->stop;

###
### A server that speaks no Redis, or not what we expect.
###

my %fakes = (
	'+OK to everything' => "+OK\r\n",
	'an error to everything' => "-ERR nope\r\n",
	'garbage' => "garbage that is no RESP\r\n",
	'a negative remaining' => "*4\r\n:1\r\n:-1\r\n:0\r\n:0\r\n",
	'a string in the array' => "*4\r\n:1\r\n:5\r\n\$1\r\nx\r\n:0\r\n",
	'an array too short' => "*2\r\n:1\r\n:5\r\n",
	'a null' => "\$-1\r\n",
	'nesting too deep' => ('*1\r\n' x 12) . ":1\r\n",
	'a bulk string that never ends' => "\$1000000\r\nabc",
	'NOSCRIPT, then +OK' => sub { $_[0] eq 'EVALSHA' ? "-NOSCRIPT gone\r\n" : "+OK\r\n" },
	'no answer, the connection closed' => sub { undef },);
$fakes{'nesting too deep'} = ("*1\r\n" x 12) . ":1\r\n";

foreach my $case (sort keys %fakes)
{
	my $fake = fake_redis_start(reply => $fakes{$case});
	for my $policy (qw(f_open f_closed))
	{
		my $d = with_url($fake->url, $policy);
		my $e = $d->{stderr};
		is_fail_mode($d, $policy, "fake server, $case: $policy");
		is($e, '', "fake server, $case: $policy: no error");
	}
	$fake->stop;
}
is($p->query_ok('SELECT pg_backend_pid()'), $p->pid, 'the backend survived them all');

# The same fake answering a well-formed reply is believed: the cases above
# failed for what they answered, not for talking to a fake.
my $good_fake = fake_redis_start(reply => "*4\r\n:1\r\n:5\r\n:0\r\n:60\r\n");
is_redis(with_url($good_fake->url, 'f_closed'),
	'a well-formed reply is a decision', allowed => 't', remaining => 5);
$good_fake->stop;

###
### Database numbers and unix sockets.
###

is_redis(with_url($redis->url(db => 3), 'f_closed', 'db3_subject'),
	'redis://.../3: Redis decides', allowed => 't');
ok((grep { /\{db3_subject\}/ } $redis->scan_keys(3)), 'the key is in database 3');
ok(!(grep { /\{db3_subject\}/ } $redis->scan_keys(0)), 'not in database 0');

is_redis(with_url($redis->unix_url, 'f_closed', 'unix_subject'),
	'unix://: Redis decides', allowed => 't');
ok((grep { /\{unix_subject\}/ } $redis->scan_keys(0)), 'the key is in database 0');
like($redis->cli('CLIENT', 'LIST'), qr/flags=U /,
	'over the unix socket (a client with flag U)');

is_redis(with_url($redis->unix_url(db => 5), 'f_closed', 'unix5_subject'),
	'unix://...?db=5: Redis decides', allowed => 't');
ok((grep { /\{unix5_subject\}/ } $redis->scan_keys(5)), 'the key is in database 5');
ok(!(grep { /\{unix5_subject\}/ } $redis->scan_keys(0)), 'not in database 0');

my $nowhere = with_url('unix:///nonexistent/redis.sock', 'f_closed');
is_fail_mode($nowhere, 'f_closed', 'a unix socket that does not exist');
is($nowhere->{stderr}, '', 'a unix socket that does not exist: no error');

$p->quit;
$long->quit;

$log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* exited with exit code [^0]/,
	'no backend crashed');
unlike($log, qr/TRAP:|PANIC:/, 'no assertion failure or panic');
$node->stop;
$redis->stop;
done_testing();
