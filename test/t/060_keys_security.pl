
# Keys are part of the security model: no raw e-mail or token in Redis, every
# key expires, databases get separate keys; and a role that may only spend
# budget can neither read the Redis URL (and its password) nor change
# policies or the settings that pick a bucket.

use strict;
use warnings;

use Digest::SHA qw(hmac_sha256_hex);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;

my $password = 'Pw-sEcReT-4711';
my $redis = redis_start(name => 'keys', password => $password);
my $node = rl_node('keys', url => $redis->url(userinfo => "default:$password"));

# Time to refill completely: k 60 s, k_frac ceil(7 * 60000 / 3) = 140000 ms;
# k_ttl keeps its buckets 2 hours.
my %refill_ms = (k => 60_000, k_frac => 140_000, k_ttl => 7_200_000);
my $policies = q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, idle_ttl) VALUES
	  ('k', 10, 10, '1 minute', NULL),
	  ('k_frac', 7, 3, '1 minute', NULL),
	  ('k_ttl', 10, 10, '1 minute', '2 hours');
};
$node->safe_psql('postgres', $policies);

# The version segment of each policy's keys: v<version>.<installation>.
my $installation = key_installation($node);
my %version = map {
	$_ => $node->safe_psql('postgres', "SELECT version FROM rl_policy WHERE name = '$_'") . $installation
} keys %refill_ms;

my $email = 'alice@example.com';
# A 200-byte bearer token.
my $token = 'sk_live_';
$token .= ('A' .. 'Z', 'a' .. 'z', 0 .. 9)[ ($_ * 7919) % 62 ] for 1 .. 192;
is(length $token, 200, 'the token has 200 bytes');
my $injection = "x}:rl:postgres:v$version{k}:{tenant_1";
my $safe_64 = 'a' x 64;
my $unsafe_65 = 'a' x 65;
my @subjects = ('tenant_1', $email, uc($email), $token, $injection, $safe_64, $unsafe_65);

my $s = session($node);
foreach my $policy (sort keys %refill_ms)
{
	foreach my $subject (@subjects)
	{
		my $d = $s->consume($policy, $subject);
		ok($d->{allowed} eq 't' && $d->{source} eq 'redis' && $d->{stderr} eq '',
			"$policy: a decision by Redis for a subject of " . length($subject) . ' bytes')
		  or diag explain $d;
	}
}

my @keys = $redis->scan_keys;
is(scalar @keys, 3 * @subjects, 'one key per policy and subject');
my $all = join "\n", @keys;
unlike($all, qr/@/, 'no "@" in any key');
unlike($all, qr/alice|example/i, 'no part of the e-mail address in any key');
my @token_pieces = map { substr($token, $_, 12) } grep { $_ % 4 == 0 } 0 .. length($token) - 12;
ok(!(grep { index($all, $_) >= 0 } @token_pieces), 'no 12-byte piece of the token in any key');
is_deeply(
	[ grep { !/\Arl:postgres:v\d+\.[0-9a-z]+:\{(?:[A-Za-z0-9_.-]{1,64}|#[0-9a-f]{32})\}:[a-z0-9_.-]+\z/ } @keys ],
	[], 'every key is rl:postgres:v<version>.<installation>:{<safe id or #hash>}:<policy>');
isnt($installation, '', 'a new installation has an id of its own in its keys');

for my $policy (sort keys %refill_ms)
{
	my $v = $version{$policy};
	ok((grep { $_ eq "rl:postgres:v$v:{tenant_1}:$policy" } @keys),
		"a safe id is kept as it is: rl:postgres:v$v:{tenant_1}:$policy");
	ok((grep { $_ eq "rl:postgres:v$v:{$safe_64}:$policy" } @keys),
		"$policy: a 64-byte safe id too");
	for my $hashed ([ email => $email ], [ token => $token ], [ injection => $injection ],
		[ '65-byte id' => $unsafe_65 ])
	{
		my $hash = substr(hmac_sha256_hex($hashed->[1], ''), 0, 32);
		ok((grep { $_ eq "rl:postgres:v$v:{#$hash}:$policy" } @keys),
			"$policy: the $hashed->[0] is the HMAC-SHA256 of the subject, 32 hex digits");
	}
}
isnt(substr(hmac_sha256_hex($email, ''), 0, 32), substr(hmac_sha256_hex(uc $email, ''), 0, 32),
	'subjects that differ in case get different hashes');
is(scalar(grep { /\{tenant_1\}:k\z/ } @keys), 1,
	'a subject that imitates a key does not reach the bucket of tenant_1');

# Every key expires: PTTL <= time to refill completely (idle_ttl when set), and
# not much less.
foreach my $key (@keys)
{
	my ($policy) = $key =~ /:([a-z0-9_.-]+)\z/;
	my $pttl = $redis->cli('PTTL', $key);
	my $max = $refill_ms{$policy};
	# Written seconds ago with a TTL of exactly $max: not shorter (an expired
	# key reads as a full bucket), not longer (memory).
	my $min = $max - 30_000;
	ok($pttl >= $min && $pttl <= $max, "$policy: PTTL $pttl in [$min, $max]")
	  or diag $key;
}

# The secret keys the hash: another secret, other keys.
$s->query_ok(q{SET ratelimit.subject_secret = 'pepper'});
$s->consume('k', $email);
my $peppered = substr(hmac_sha256_hex($email, 'pepper'), 0, 32);
ok((grep { $_ eq "rl:postgres:v$version{k}:{#$peppered}:k" } $redis->scan_keys),
	'with ratelimit.subject_secret set, the key is the HMAC with that secret');
$s->query_ok('RESET ratelimit.subject_secret');

# Prefix and scope settings name the first two segments.
$s->query_ok(q{SET ratelimit.key_prefix = 'app1'; SET ratelimit.key_scope = 'shared'});
$s->consume('k', 'tenant_1');
ok((grep { $_ eq "app1:shared:v$version{k}:{tenant_1}:k" } $redis->scan_keys),
	'ratelimit.key_prefix and ratelimit.key_scope are the first segments');
$s->query_ok('RESET ratelimit.key_prefix; RESET ratelimit.key_scope');

###
### Two databases on one server: separate keys for the same policy and subject.
###

$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION ratelimit');
$node->safe_psql('other', $policies);
my $other = session($node, db => 'other');
my $v_other = $node->safe_psql('other', q{SELECT version FROM rl_policy WHERE name = 'k'})
  . key_installation($node, 'other');
for my $i (1 .. 10)
{
	$s->consume('k', 'both_dbs');
}
my $exhausted = $s->consume('k', 'both_dbs');
is_deeply([ @$exhausted{qw(allowed remaining source)} ], [ 'f', 0, 'redis' ],
	'database postgres has spent the bucket');
my $d_other = $other->consume('k', 'both_dbs');
is_deeply([ @$d_other{qw(allowed remaining source)} ], [ 't', 9, 'redis' ],
	'database other has a bucket of its own');
@keys = $redis->scan_keys;
ok((grep { $_ eq "rl:postgres:v$version{k}:{both_dbs}:k" } @keys), 'key of database postgres');
ok((grep { $_ eq "rl:other:v$v_other:{both_dbs}:k" } @keys), 'key of database other');
$other->quit;

###
### A role that may only spend budget.
###

$node->safe_psql(
	'postgres', q{
	CREATE ROLE app LOGIN;
	GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text) TO app;
});
my $app = session($node, user => 'app');
my $stderr_all = '';

my $d_app = $app->consume('k', 'tenant_app');
is_deeply([ @$d_app{qw(allowed remaining source stderr)} ], [ 't', 9, 'redis', '' ],
	'app can call rl_consume (and needs no privilege on rl_policy)');

# Runs sql as app; checks that it fails with SQLSTATE state.
sub app_fails
{
	my ($sql, $state, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my ($out, $err) = $app->query($sql);
	$stderr_all .= "$out\n$err\n";
	is(sqlstate_of($err), $state, "$name ($state)") or diag "$sql\n$err";
}

app_fails('SHOW ratelimit.redis_url', '42501', 'app cannot SHOW ratelimit.redis_url');
app_fails(q{SELECT current_setting('ratelimit.redis_url')},
	'42501', 'app cannot read it with current_setting');
app_fails(q{SELECT current_setting('ratelimit.redis_url', true)},
	'42501', 'not even with missing_ok');
app_fails(q{SHOW ratelimit.subject_secret}, '42501', 'app cannot SHOW ratelimit.subject_secret');
app_fails(q{SET ratelimit.redis_url = 'redis://127.0.0.1:1'},
	'42501', 'app cannot SET ratelimit.redis_url');
app_fails(q{SELECT set_config('ratelimit.redis_url', 'redis://127.0.0.1:1', false)},
	'42501', 'nor with set_config');
app_fails(q{ALTER ROLE app SET ratelimit.redis_url = 'redis://127.0.0.1:1'},
	'42501', 'nor for its own role');
foreach my $setting (qw(key_prefix key_scope subject_secret test_clock_ms))
{
	my $value = $setting eq 'test_clock_ms' ? '1000' : 'x';
	app_fails("SET ratelimit.$setting = '$value'",
		'42501', "app cannot SET ratelimit.$setting");
}
app_fails(q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('mine', 1000, 1000, '1 second')},
	'42501', 'app cannot INSERT into rl_policy');
app_fails(q{UPDATE rl_policy SET capacity = 1000000 WHERE name = 'k'},
	'42501', 'app cannot UPDATE rl_policy');
app_fails(q{DELETE FROM rl_policy}, '42501', 'app cannot DELETE from rl_policy');
app_fails(q{TRUNCATE rl_policy}, '42501', 'app cannot TRUNCATE rl_policy');
app_fails(q{SELECT * FROM rl_policy}, '42501', 'app cannot SELECT from rl_policy');
app_fails(decision_sql('k', 'tenant_app', 1, 'rl_enforce'),
	'42501', 'app cannot call rl_enforce, which it was not granted');
is($node->safe_psql('postgres', q{SELECT capacity FROM rl_policy WHERE name = 'k'}),
	'10', 'the policy is unchanged');

for my $setting (qw(command_timeout connect_timeout))
{
	my ($out, $err) = $app->query("SET ratelimit.$setting = '2s'; SHOW ratelimit.$setting");
	is($err, '', "app can SET ratelimit.$setting");
}
is($app->consume('k', 'tenant_app')->{source}, 'redis', 'and still decides by Redis');

# Nothing app can read holds the URL's password.
for my $sql (
	q{SELECT string_agg(s::text, E'\n') FROM pg_settings s},
	q{SELECT string_agg(s::text, E'\n') FROM pg_show_all_settings() s},
	q{SHOW ALL},
	q{SELECT * FROM pg_file_settings})
{
	my ($out, $err) = $app->query($sql);
	$stderr_all .= "$out\n$err\n";
	unlike($out . $err, qr/\Q$password\E/, "no password in what app reads: $sql");
}
my ($app_settings) = $app->query(
	q{SELECT count(*) FROM pg_settings WHERE name IN ('ratelimit.redis_url', 'ratelimit.subject_secret')});
is($app_settings, '0', 'pg_settings shows app neither the URL nor the secret');
like(
	$node->safe_psql('postgres',
		q{SELECT setting FROM pg_settings WHERE name = 'ratelimit.redis_url'}),
	qr/\Q$password\E/,
	'(a superuser sees the URL there, password included)');
unlike($stderr_all, qr/\Q$password\E/, 'no password in any answer app got');
unlike(slurp_file($node->logfile), qr/\Q$password\E/, 'no password in the server log');

$app->quit;
$s->quit;
$node->stop;
$redis->stop;
done_testing();
