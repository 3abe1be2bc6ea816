
# Exactly N grants for N tokens, however many sessions race for them: 120
# pgbench clients, each in its own backend with its own Redis connection, make
# many more attempts than the bucket has tokens.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;

my $clients = 120;

my $redis = redis_start(name => 'concurrency');
my $node = rl_node(
	'concurrency',
	redis => $redis,
	max_connections => $clients + 20,
	# A deadline no loaded machine misses: a timeout would take a token
	# without a grant and hide a race.
	conf => ["ratelimit.command_timeout = '10s'"]);

# Capacity 100, 1 token a day: no refill during the run. 'closed', so any
# Redis failure shows up as missing grants, never as extra ones. Without the deny
# cache, so that every attempt races in Redis (and the last check is Redis's); the
# cache's own race is conc_cached below.
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, deny_cache) VALUES
	  ('conc', 100, 1, '1 day', 'closed', false),
	  ('conc_w', 100, 1, '1 day', 'closed', false),
	  ('conc_cached', 100, 1, '1 day', 'closed', true);
	CREATE TABLE attempts (pid int, what text);
	CREATE TABLE grants (pid int);
	CREATE TABLE grants_w (pid int);
});

my $dir = PostgreSQL::Test::Utils::tempdir();

# Runs pgbench with clients sessions, each running script transactions times.
sub pgbench
{
	my ($name, $script, $transactions) = @_;
	my $file = "$dir/$name.sql";
	append_to_file($file, $script);
	run_pgbench($node, $name, $file, $clients, $transactions);
	return;
}

# Unit cost: 600 attempts at a 100-token bucket.
pgbench(
	'unit', q{
INSERT INTO attempts VALUES (pg_backend_pid(), 'unit');
INSERT INTO grants SELECT pg_backend_pid() WHERE (rl_consume('conc', 'tenant_1', 1)).allowed;
}, 5);

is($node->safe_psql('postgres', 'SELECT count(*) FROM grants'),
	'100', 'exactly 100 grants for 100 tokens');
is( $node->safe_psql(
		'postgres', "SELECT count(DISTINCT pid) FROM attempts WHERE what = 'unit'"),
	$clients,
	"$clients sessions took part (pgbench holds them all open at once)");
cmp_ok(
	$node->safe_psql('postgres', 'SELECT count(DISTINCT pid) FROM grants'),
	'>', 1, 'grants went to more than one session');

# Each session its own connection; with shared connections, the server's one (and
# the test's own redis-cli).
my $connections = $redis->cli('INFO', 'stats') =~ /^total_connections_received:(\d+)/m ? $1 : 0;
if (($ENV{RL_REDIS_CONNECTIONS} // 'backend') eq 'shared')
{
	cmp_ok($connections, '<', 10, "$clients sessions shared one Redis connection ($connections)");
}
else
{
	cmp_ok($connections, '>=', $clients, 'every session had its own Redis connection');
}

my $after = consume($node, 'conc', 'tenant_1');
is_deeply(
	[ @$after{qw(allowed remaining source)} ],
	[ 'f', 0, 'redis' ],
	'the bucket is empty afterwards, by Redis');
cmp_ok($after->{retry_after_ms}, '>', 0, 'and says when to retry');

# Weighted: cost 7 on capacity 100 gives exactly 14 grants, 2 tokens left.
pgbench(
	'weighted', q{
INSERT INTO attempts VALUES (pg_backend_pid(), 'weighted');
INSERT INTO grants_w SELECT pg_backend_pid() WHERE (rl_consume('conc_w', 'tenant_1', 7)).allowed;
}, 2);

is($node->safe_psql('postgres', 'SELECT count(*) FROM grants_w'),
	'14', 'exactly 14 grants of 7 tokens from 100');

my $weighted = consume($node, 'conc_w', 'tenant_1', 7);
is_deeply(
	[ @$weighted{qw(allowed remaining source)} ],
	[ 'f', 2, 'redis' ],
	'cost 7 is refused with 2 tokens left');
my $last = consume($node, 'conc_w', 'tenant_1', 2);
is_deeply(
	[ @$last{qw(allowed remaining source)} ],
	[ 't', 0, 'redis' ],
	'the last 2 tokens can still be taken');

# Every other algorithm: 100 tokens (no refill, no window end during the run), 240
# attempts from 120 sessions, exactly 100 grants.
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, fail_mode, deny_cache) VALUES
	  ('conc_gcra', 'gcra', 100, 1, '1 day', 'closed', false),
	  ('conc_fixed', 'fixed_window', 100, NULL, '1000 days', 'closed', false),
	  ('conc_sliding', 'sliding_window', 100, NULL, '1000 days', 'closed', false),
	  ('conc_log', 'sliding_log', 100, NULL, '1 day', 'closed', false);
	CREATE TABLE grants_alg (policy text, pid int);
});
for my $policy (qw(conc_gcra conc_fixed conc_sliding conc_log conc_cached))
{
	pgbench(
		$policy, qq{
INSERT INTO grants_alg SELECT '$policy', pg_backend_pid() WHERE (rl_consume('$policy', 'tenant_1', 1)).allowed;
}, 2);
	is($node->safe_psql('postgres', "SELECT count(*) FROM grants_alg WHERE policy = '$policy'"),
		'100', "$policy: exactly 100 grants for 100 tokens");
	my $empty = consume($node, $policy, 'tenant_1');
	is_deeply([ @$empty{qw(allowed remaining)} ], [ 'f', 0 ], "$policy: empty afterwards");
	is($empty->{source}, $policy eq 'conc_cached' ? 'deny_cache' : 'redis',
		$policy eq 'conc_cached' ? "$policy: the denial remembered" : "$policy: by Redis");
}

my $log = slurp_file($node->logfile);
unlike($log, qr/Redis cannot answer/, 'Redis answered every decision');
unlike($log, qr/server process .* was terminated/, 'no backend crashed');

$node->stop;
$redis->stop;
done_testing();
