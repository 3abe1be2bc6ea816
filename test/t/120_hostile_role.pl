# A hostile (or careless) role must not change what other sessions get, read a secret,
# or make a subject reach the server log:
#  - the shared breaker: a role's, database's, startup packet's, session's or
#    function's short command_timeout or connect_timeout, through a real delay, trips
#    only the session's own decisions;
#  - secrets: a password or the subject secret is refused where other roles can read
#    it (role, database and function settings; postgresql.conf without preload), never
#    logged on reload, and can come from a file only the server's user reads;
#  - subjects: no statement or context line carries one, for a denial raised through
#    EXECUTE or a cancel while waiting for the policy lock.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

use RateLimitTest;

my $password = 'p4ss-w0rd-for-120';
my $redis = redis_start(name => 'hostile', password => $password);
# 5 ms each way: a Redis one 10 ms round trip away, more than a 1 ms timeout.
my $proxy = delay_proxy_start(target_port => $redis->port, delay_ms => 5);
my $url = "redis://:$password\@127.0.0.1:" . $proxy->port;

my $node = rl_node('hostile', url => $url,
	conf => [ "log_line_prefix = '%p '", "log_min_error_statement = error" ]);
$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('h.closed', 1000, 1000, '1 second', 'closed'),
	  ('h.open', 1000, 1000, '1 second', 'open');
	CREATE ROLE app LOGIN;
	CREATE ROLE other LOGIN;
	GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_enforce(text, text, bigint, interval, text)
	  TO app, other;
	CREATE DATABASE victim;
});
$node->safe_psql('victim', q{
	CREATE EXTENSION ratelimit;
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('h.closed', 1000, 1000, '1 second', 'closed');
});

###
### (1) The shared breaker trips only for the server's own timeouts.
###

# Every route a role can take to a shorter timeout; each must leave the shared breaker
# closed, and other roles (in another database too) decided by Redis.
my $victim = session($node, db => 'victim');
my $admin = session($node);
is($victim->consume('h.closed', 'victim_tenant')->{source}, 'redis', 'the victim is decided by Redis');

# Checks that after the attacker's own timeout the breaker is closed for everyone else.
sub breaker_still_closed
{
	my ($route, $attacker_decision) = @_;
	is($attacker_decision->{source}, 'fail_closed',
		"$route: the role's own decision times out (its own choice)")
	  or diag explain $attacker_decision;
	my $h = health($admin);
	is_deeply([ @$h{qw(breaker shared)} ], [ 'closed', 't' ],
		"$route: the shared breaker stays closed")
	  or diag explain $h;
	is($victim->consume('h.closed', 'victim_tenant')->{source}, 'redis',
		"$route: another role in another database is still decided by Redis");
	is(session_decision('other', 'h.closed')->{source}, 'redis',
		"$route: another role in the same database too");
}

# One decision in a new session of role (with options for its startup packet).
sub session_decision
{
	my ($role, $policy, %opt) = @_;
	my $s = session($node, user => $role, %opt);
	my $d = $s->consume($policy, 'tenant_' . $role);
	$s->quit;
	return $d;
}

$node->safe_psql('postgres', q{ALTER ROLE app SET ratelimit.command_timeout = '1ms'});
breaker_still_closed('ALTER ROLE SET command_timeout', session_decision('app', 'h.closed'));
$node->safe_psql('postgres', q{ALTER ROLE app RESET ratelimit.command_timeout});

$node->safe_psql('postgres', q{ALTER DATABASE postgres SET ratelimit.command_timeout = '1ms'});
my $db_default = session_decision('app', 'h.closed');
$node->safe_psql('postgres', q{ALTER DATABASE postgres RESET ratelimit.command_timeout});
breaker_still_closed('ALTER DATABASE SET command_timeout', $db_default);

breaker_still_closed('a startup option (PGOPTIONS)',
	session_decision('app', 'h.closed', options => '-c ratelimit.command_timeout=1ms'));

{
	my $s = session($node, user => 'app');
	$s->query_ok(q{SET ratelimit.command_timeout = '1ms'});
	breaker_still_closed('SET command_timeout', $s->consume('h.closed', 'tenant_app'));
	$s->quit;
}

$node->safe_psql('postgres', q{
	CREATE FUNCTION app_decide() RETURNS rl_decision
	LANGUAGE sql SET ratelimit.command_timeout = '1ms'
	AS $$ SELECT * FROM rl_consume('h.closed', 'tenant_app') $$;
	GRANT EXECUTE ON FUNCTION app_decide() TO app;
});
{
	my $s = session($node, user => 'app');
	my ($out) = $s->query('SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source FROM app_decide()');
	breaker_still_closed('a function SET clause', parse_decision($out) // {});
	$s->quit;
}

# connect_timeout: AUTH is part of connecting, and it is a round trip away.
# With shared connections the server's worker connects, with the server's connect_timeout:
# the role's own bounds nothing, and its decision is Redis's.
$node->safe_psql('postgres', q{ALTER ROLE app SET ratelimit.connect_timeout = '1ms'});
if (($ENV{RL_REDIS_CONNECTIONS} // 'backend') eq 'shared')
{
	is(session_decision('app', 'h.closed')->{source}, 'redis',
		'ALTER ROLE SET connect_timeout, shared connections: the server\'s connection, decided by Redis');
}
else
{
	breaker_still_closed('ALTER ROLE SET connect_timeout', session_decision('app', 'h.closed'));
}
$node->safe_psql('postgres', q{ALTER ROLE app RESET ratelimit.connect_timeout});

# The server's own timeout does trip it: postgresql.conf at 1 ms, for everyone.
$node->append_conf('postgresql.conf', "ratelimit.command_timeout = '1ms'");
$node->reload;
ok($node->poll_query_until('postgres', q{SELECT current_setting('ratelimit.command_timeout') = '1ms'}),
	'postgresql.conf: command_timeout 1 ms for the whole server');
my $fresh = session($node);
is($fresh->consume('h.closed', 'tenant_conf')->{source}, 'fail_closed',
	'the server-wide timeout passes: the fail mode');
is(health($fresh)->{breaker}, 'open', 'and a timeout at the server-wide value opens the shared breaker');
$fresh->quit;
$node->append_conf('postgresql.conf', "ratelimit.command_timeout = '250ms'");
$node->reload;
ok($node->poll_query_until('postgres',
	q{SELECT source = 'redis' FROM rl_consume('h.closed', 'tenant_back')}),
	'back at 250 ms: Redis decides again once the breaker lets a probe through');

###
### (2) Secrets, with the library preloaded.
###

my $plain = session($node, user => 'other');
for my $name (qw(ratelimit.redis_url ratelimit.subject_secret))
{
	my (undef, $err) = $plain->query("SELECT current_setting('$name')");
	is(sqlstate_of($err), '42501', "a role without the right to read settings cannot read $name");
}
my ($settings) = $plain->query(
	q{SELECT string_agg(name || '=' || setting, ',') FROM pg_settings WHERE name LIKE 'ratelimit.%'});
unlike($settings // '', qr/\Q$password\E/, 'pg_settings shows no password to it');
$plain->quit;

# Where other roles could read it, a secret is refused with 42501 and never stored,
# and the server log shows neither the statement nor the value.
my $refused_offset = log_offset($node);
my %refused = (
	'ALTER ROLE ... SET ratelimit.redis_url' =>
	  qq{ALTER ROLE app SET ratelimit.redis_url = 'redis://:other-pw\@127.0.0.1:1'},
	'ALTER DATABASE ... SET ratelimit.redis_url' =>
	  qq{ALTER DATABASE postgres SET ratelimit.redis_url = 'redis://u:other-pw\@127.0.0.1:1'},
	'ALTER ROLE ... SET ratelimit.subject_secret' =>
	  q{ALTER ROLE app SET ratelimit.subject_secret = 'other-pw'},
	'ALTER ROLE ALL ... SET ratelimit.subject_secret' =>
	  q{ALTER ROLE ALL SET ratelimit.subject_secret = 'other-pw'},
	'a function SET clause' =>
	  qq{CREATE FUNCTION leaky() RETURNS int LANGUAGE sql SET ratelimit.redis_url = 'redis://:other-pw\@127.0.0.1:1' AS 'SELECT 1'},
);
foreach my $route (sort keys %refused)
{
	my ($out, $err) = $admin->query($refused{$route});
	is(sqlstate_of($err), '42501', "$route: refused (42501)") or diag $err;
	like($err, qr/must not hold a secret where other roles can read it/, "$route: saying why");
	unlike($err, qr/other-pw/, "$route: the error does not echo the secret");
}
# A value PostgreSQL itself refuses (an integer setting given text, named in any case).
my (undef, $typo_err) = $admin->query(q{SET RateLimit.Redis_URL = 'redis://:other-pw@127.0.0.1:1/notanumber'});
like($typo_err, qr/ratelimit.redis_url/i, 'a URL PostgreSQL refuses: an error');
ok(wait_for_log($node, qr/must not hold a secret/, $refused_offset), 'the refusals are logged');
my $refused_log = log_since($node, $refused_offset);
unlike($refused_log, qr/other-pw/, 'the server log holds neither the refused statements nor their values')
  or diag $refused_log;
like($refused_log, qr/must not hold a secret where other roles can read it/, 'but it says what was refused');
is($admin->query_ok(q{SELECT count(*) FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%other-pw%'}),
	'0', 'nothing of it reached pg_db_role_setting');
is($admin->query_ok(q{SELECT count(*) FROM pg_proc WHERE array_to_string(proconfig, ',') LIKE '%other-pw%'}),
	'0', 'nor pg_proc');
# The same settings without a secret are fine there.
$admin->query_ok(q{ALTER ROLE app SET ratelimit.redis_url = 'redis://127.0.0.1:1'});
$admin->query_ok(q{ALTER ROLE app RESET ratelimit.redis_url});

# A reload that changes the URL: PostgreSQL's line leaves the value out.
my $offset = log_offset($node);
my $new_password = 'n3w-p4ss-for-120';
$redis->cli('CONFIG', 'SET', 'requirepass', $new_password);
$redis->{password} = $new_password;
$node->append_conf('postgresql.conf',
	"ratelimit.redis_url = 'redis://:$new_password\@127.0.0.1:" . $proxy->port . "'");
$node->reload;
ok(wait_for_log($node, qr/parameter "ratelimit.redis_url" changed \(its value is not logged/, $offset),
	'the reload line names the setting, not its value');
ok($node->poll_query_until('postgres',
	q{SELECT source = 'redis' FROM rl_consume('h.closed', 'tenant_reload')}),
	'decisions use the new password');
my $log = log_since($node, $offset);
unlike($log, qr/\Q$new_password\E|\Q$password\E/, 'no password in the log');

# A password file: the URL names none, the file is the server user's alone.
my $dir = PostgreSQL::Test::Utils::tempdir();
my $password_file = "$dir/redis.password";
PostgreSQL::Test::Utils::append_to_file($password_file, "$new_password\n");
chmod 0600, $password_file;
$node->append_conf('postgresql.conf', join("\n",
	"ratelimit.redis_url = 'redis://127.0.0.1:" . $proxy->port . "'",
	"ratelimit.redis_password_file = '$password_file'"));
$node->reload;
ok($node->poll_query_until('postgres',
	q{SELECT source = 'redis' FROM rl_consume('h.closed', 'tenant_file')}),
	'ratelimit.redis_password_file: the password comes from the file');
$plain = session($node, user => 'other');
my ($file_out, $file_err) = $plain->query("SELECT pg_read_file('$password_file')");
is(sqlstate_of($file_err), '42501', 'a role cannot read the password file through the server');
$plain->quit;
chmod 0644, $password_file;
# A new session opens a new connection, which reads the file again; with shared
# connections, the worker's next one does (started again here).
if (($ENV{RL_REDIS_CONNECTIONS} // 'backend') eq 'shared')
{
	my $workers = "SELECT string_agg(pid::text, ',') FROM pg_stat_activity WHERE backend_type = 'ratelimit connection'";
	my $before = $node->safe_psql('postgres', $workers);
	$node->safe_psql('postgres',
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'ratelimit connection'");
	my $n = scalar split /,/, $before;
	ok($node->poll_query_until('postgres',
		"SELECT count(*) FILTER (WHERE pid NOT IN ($before)) = $n FROM pg_stat_activity WHERE backend_type = 'ratelimit connection'"),
		'shared connections: the workers start again');
}
my $loose = session($node);
is($loose->consume('h.closed', 'tenant_loose')->{source}, 'fail_closed',
	'a password file that others may read is refused: the fail mode');
like(health($loose)->{last_error}, qr/^configuration: ratelimit.redis_password_file: others may read it$/,
	'rl_health says why');
$loose->quit;
chmod 0600, $password_file;
ok($node->poll_query_until('postgres',
	q{SELECT source = 'redis' FROM rl_consume('h.closed', 'tenant_file_again')}),
	'the file readable by the server alone again: Redis decides');

###
### (2) Secrets, without preload: postgresql.conf is readable by every role until the
### library loads, so a secret there is refused; the files work.
###

my $unloaded = rl_node('hostile_nopreload', preload => 0, url => $url,
	conf => [ "ratelimit.subject_secret = 'conf-secret-120'", "log_line_prefix = '%p '" ]);
$unloaded->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('u.closed', 10, 10, '1 minute', 'closed');
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text) TO app;
});
my $u = session($unloaded, user => 'app');
my ($conf_url) = $u->query(q{SELECT current_setting('ratelimit.redis_url', true)});
note 'without preload, before the library loads, the placeholder reads as: '
  . (($conf_url // '') =~ /\Q$password\E/ ? 'the URL with its password' : 'something else');
my $refused_url = $u->consume('u.closed', 'tenant_u');
is($refused_url->{source}, 'fail_closed', 'no preload: a password in postgresql.conf is refused, the fail mode') or diag explain $refused_url;
like($refused_url->{stderr}, qr/ratelimit.redis_url must not hold a secret where other roles can read it/,
	'the session is told why when the library loads');
$u->quit;
my $u_admin = session($unloaded);
my (undef, $hash_err) = $u_admin->query(q{SELECT rl_subject_hash('alice@example.com')});
is(sqlstate_of($hash_err), '55000',
	'no preload: a subject secret in postgresql.conf is refused (55000): no subject is hashed without it');
$u_admin->consume('u.closed', 'tenant_admin');
is(health($u_admin)->{last_error}, 'configuration: ratelimit.redis_url refused: a password others can read',
	'rl_health says why');
$u_admin->quit;

# The files instead: nothing secret in any setting.
my $secret_file = "$dir/subject.secret";
PostgreSQL::Test::Utils::append_to_file($secret_file, "file-secret-120\n");
chmod 0600, $secret_file;
$unloaded->append_conf('postgresql.conf', join("\n",
	"ratelimit.redis_url = 'redis://127.0.0.1:" . $proxy->port . "'",
	"ratelimit.redis_password_file = '$password_file'",
	"ratelimit.subject_secret = ''",
	"ratelimit.subject_secret_file = '$secret_file'"));
$unloaded->reload;
ok($unloaded->poll_query_until('postgres',
	q{SELECT source = 'redis' FROM rl_consume('u.closed', 'tenant_files')}),
	'no preload, password file: decided by Redis');
$u = session($unloaded, user => 'app');
my ($placeholder) = $u->query(q{SELECT current_setting('ratelimit.redis_url', true)});
unlike($placeholder // '', qr/\Q$new_password\E/, 'what any role can read of the URL holds no password');
my $hashed = $u->consume('u.closed', 'alice@example.com');
is_deeply([ @$hashed{qw(allowed source stderr)} ], [ 't', 'redis', '' ],
	'a hashed subject is decided with the secret from the file');
$u->quit;
# A role setting stored while the library was not loaded is refused when it loads.
$unloaded->safe_psql('postgres',
	qq{ALTER ROLE app SET ratelimit.redis_url = 'redis://:$new_password\@127.0.0.1:} . $proxy->port . q{'});
$u = session($unloaded, user => 'app');
my $role_url = $u->consume('u.closed', 'tenant_role');
like($role_url->{stderr}, qr/must not hold a secret where other roles can read it/,
	'no preload: a role setting that holds a password is refused when the library loads');
is($role_url->{source}, 'fail_closed', 'so that role has no Redis: the fail mode');
$u->quit;
$unloaded->safe_psql('postgres', q{ALTER ROLE app RESET ratelimit.redis_url});
my $unloaded_log = slurp_file($unloaded->logfile);
unlike($unloaded_log, qr/file-secret-120/, 'no subject secret in the log');

###
### (12) No subject in any statement or context line.
###

$offset = log_offset($node);
my $denied = session($node);
$denied->query_ok(q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode)
	VALUES ('h.tiny', 1, 1, '1 day', 'closed')});
$denied->query(q{SELECT rl_enforce('h.tiny', 'someone@example.com')});
my ($e_out, $e_err) = $denied->query(q{DO $$ BEGIN EXECUTE format('SELECT rl_enforce(%L, %L)', 'h.tiny', 'someone@example.com'); END $$});
is(sqlstate_of($e_err), 'RL429', 'a denial raised through EXECUTE format(...)');
like($e_err, qr/CONTEXT:/, 'the client still gets its context');

# A cancel while waiting for the policy lock (a session with no policies cached yet).
my $locker = session($node);
$locker->query_ok('BEGIN; LOCK TABLE rl_policy IN ACCESS EXCLUSIVE MODE');
my $waiter = session($node);
$waiter->query_ok(q{SET ratelimit.command_timeout = '20s'});
$waiter->start_query(q{SELECT rl_consume('h.closed', 'waiter@example.com')});
ok($node->poll_query_until('postgres',
	"SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = " . $waiter->pid),
	'the session waits for the policy lock');
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $waiter->pid . ')');
my (undef, $cancelled) = $waiter->wait_result;
is(sqlstate_of($cancelled), '57014', 'the wait is cancelled');
$locker->query_ok('ROLLBACK');
ok(wait_for_log($node, qr/canceling statement due to user request/, $offset), 'the cancel is logged');
$log = log_since($node, $offset);
like($log, qr/rate limit exceeded for policy "h.tiny"/, 'the denial is logged');
unlike($log, qr/someone|waiter|example\.com/, 'with no subject: no STATEMENT and no CONTEXT line carries one');
unlike($log, qr/^\d+ (?:STATEMENT|CONTEXT):.*rl_(?:enforce|consume)/m,
	'no statement or context line of our functions at all');

done_testing();
