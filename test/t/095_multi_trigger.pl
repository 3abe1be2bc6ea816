
# rl_consume_all and rl_limit_trigger against a real redis-server: the keys of
# one rl_consume_all share a Redis Cluster hash tag (and so one slot, checked
# with CLUSTER KEYSLOT, and in a one-node cluster that refuses CROSSSLOT
# scripts); racing clients never get more grants than the tightest bucket holds
# and never charge part of a group; a row trigger under concurrency lets exactly
# capacity rows in; a statement trigger charges each statement at once.

use strict;
use warnings;

use Digest::SHA qw(hmac_sha256_hex);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $clients = 32;

my $redis = redis_start(name => 'multi');
my $node = rl_node(
	'multi',
	redis => $redis,
	max_connections => $clients + 20,
	# A deadline no loaded machine misses: a timeout would show up as a
	# fail-mode decision and hide (or fake) a race.
	conf => ["ratelimit.command_timeout = '10s'"]);

# One token a day at most: nothing refills during the run. 'closed', so any
# Redis failure shows up as missing grants, never as extra ones.
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('multi.keys', 10, 10, '1 day', 'closed'),
	  ('multi.tenant', 100, 1, '1 day', 'closed'),
	  ('multi.user', 1000, 1, '1 day', 'closed'),
	  ('multi.tenant_big', 1000, 1, '1 day', 'closed'),
	  ('multi.user_small', 5, 1, '1 day', 'closed'),
	  ('trig.rows', 50, 1, '1 day', 'closed'),
	  ('trig.triples', 50, 1, '1 day', 'closed'),
	  ('trig.bulk', 50, 1, '1 day', 'closed');
});
my %version = map {
	$_ => $node->safe_psql('postgres', "SELECT version FROM rl_policy WHERE name = '$_'")
} qw(multi.keys);

# The remaining tokens of a bucket, by rl_peek (which takes nothing).
sub level
{
	my ($policy, $subject) = @_;
	return $node->safe_psql('postgres',
		sprintf('SELECT remaining FROM rl_peek(%s, %s)',
			quote_literal($policy), quote_literal($subject)));
}

#
# Keys: one hash tag, one slot.
#
my $v = $version{'multi.keys'} . key_installation($node);
is( $node->safe_psql(
		'postgres', q{
	SELECT string_agg(allowed || '/' || source, ',')
	FROM rl_consume_all(ARRAY['multi.keys', 'multi.keys', 'multi.keys'],
	                    ARRAY['acme', 'acme/bob', 'acme/x y'])}),
	'true/redis,true/redis,true/redis',
	'rl_consume_all on acme, acme/bob and acme/x y: granted by Redis');

my @keys = grep { /:multi\.keys\z/ } $redis->scan_keys;
my $hashed_rest = substr(hmac_sha256_hex('x y', ''), 0, 32);
is_deeply(
	\@keys,
	[
		sort "rl:postgres:v$v:{acme}:multi.keys",
		"rl:postgres:v$v:{acme}/bob:multi.keys",
		"rl:postgres:v$v:{acme}/#$hashed_rest:multi.keys"
	],
	'keys: {acme}, {acme}/bob, and {acme}/#hash for a rest that is not a safe id')
  or diag explain \@keys;
is(scalar(grep { index($_, '{acme}') >= 0 } @keys), 3, 'every key holds the hash tag {acme}');
is(scalar(grep { /\{[^}]*\{|\}[^{]*\}/ } @keys), 0, 'no key holds a second brace pair');

# CLUSTER KEYSLOT needs a cluster-enabled server; it computes the slot only.
my $cluster = redis_start(
	name => 'cluster',
	args => [ '--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf' ]);
my %slot = map { $_ => $cluster->cli('CLUSTER', 'KEYSLOT', $_) } @keys;
note explain \%slot;
is(scalar(keys %{ { reverse %slot } }), 1, 'CLUSTER KEYSLOT: the three keys share one slot');
is($slot{"rl:postgres:v$v:{acme}:multi.keys"}, $cluster->cli('CLUSTER', 'KEYSLOT', 'acme'),
	'the slot of the hash tag "acme"');
isnt($cluster->cli('CLUSTER', 'KEYSLOT', "rl:postgres:v$v:{globex}/bob:multi.keys"),
	$slot{"rl:postgres:v$v:{acme}/bob:multi.keys"},
	'globex/bob would be in another slot (the check above is not vacuous)');

# A one-node cluster that owns every slot runs scripts only on keys of one slot
# (CROSSSLOT otherwise): rl_consume_all works against it.
$cluster->cli('CLUSTER', 'ADDSLOTSRANGE', '0', '16383');
my $deadline = time + 15;
usleep(50_000) until $cluster->cli('CLUSTER', 'INFO') =~ /cluster_state:ok/ || time > $deadline;
like($cluster->cli('CLUSTER', 'INFO'), qr/cluster_state:ok/, 'the one-node cluster is up');
like($cluster->cli('EVAL', 'return 1', '2', '{acme}x', '{globex}y'),
	qr/CROSSSLOT/, 'the cluster refuses a script on keys of two slots');
my $cluster_url = $cluster->url;
is( $node->safe_psql(
		'postgres', qq{
	SET ratelimit.redis_url = '$cluster_url';
	SELECT string_agg(allowed || '/' || remaining || '/' || source, ',')
	FROM rl_consume_all(ARRAY['multi.keys', 'multi.keys', 'multi.keys'],
	                    ARRAY['acme', 'acme/bob', 'acme/x y'], ARRAY[1, 2, 3])}),
	'true/9/redis,true/8/redis,true/7/redis',
	'rl_consume_all runs as one script in the cluster');
is_deeply(
	[ sort grep { /:multi\.keys\z/ } $cluster->scan_keys ],
	\@keys, 'the same keys in the cluster');
is( $node->safe_psql(
		'postgres', qq{
	SET ratelimit.redis_url = '$cluster_url';
	SELECT string_agg(allowed || '/' || source, ',')
	FROM rl_consume_all(ARRAY['multi.keys', 'multi.keys'], ARRAY['acme/carol', 'acme/dave'])}),
	'true/redis,true/redis', 'two users of one tenant, without the tenant');
$cluster->stop;

#
# Concurrency: $clients pgbench clients race for a tenant bucket of 100 and
# per-user buckets of 1000 in one rl_consume_all each.
#
$node->safe_psql(
	'postgres', q{
	CREATE TABLE attempts (phase text, u int, checks int, granted int, sources text);
	CREATE TABLE trig_rows (id serial, tenant text);
	CREATE TRIGGER trig_rows_limit BEFORE INSERT ON trig_rows
	    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.rows', 'tenant');
	CREATE TABLE trig_triples (id serial, tenant text);
	CREATE TRIGGER trig_triples_limit BEFORE INSERT ON trig_triples
	    FOR EACH ROW EXECUTE FUNCTION rl_limit_trigger('trig.triples', 'tenant');
	CREATE TABLE trig_bulk (id serial, tenant text);
	CREATE TRIGGER trig_bulk_limit AFTER INSERT ON trig_bulk
	    REFERENCING NEW TABLE AS new_rows
	    FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('trig.bulk', 'tenant');
	CREATE TABLE denials (what text);
});

my $dir = PostgreSQL::Test::Utils::tempdir();

# Runs pgbench: clients sessions, each running script transactions times.
sub pgbench
{
	my ($name, $clients, $transactions, $script) = @_;
	my $file = "$dir/$name.sql";
	append_to_file($file, $script);
	run_pgbench($node, $name, $file, $clients, $transactions);
	return;
}

# 8 users, 4 clients each (by client id), 20 attempts per client: 640 attempts.
pgbench(
	'consume_all', $clients, 20, q{
\set u :client_id % 8 + 1
INSERT INTO attempts
SELECT 'tenant', :u, count(*), count(*) FILTER (WHERE allowed), string_agg(DISTINCT source, ',')
FROM rl_consume_all(ARRAY['multi.tenant', 'multi.user'], ARRAY['acme', 'acme/u' || :u]);
});

is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM attempts WHERE phase = 'tenant'}),
	$clients * 20, 'every attempt recorded');
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM attempts WHERE phase = 'tenant' AND (checks <> 2 OR granted NOT IN (0, 2))}),
	'0', 'every call answered both checks, and granted both or neither');
is( $node->safe_psql(
		'postgres', q{SELECT string_agg(DISTINCT sources, ',') FROM attempts WHERE phase = 'tenant'}),
	'redis', 'Redis made every decision');
my $grants = $node->safe_psql('postgres',
	q{SELECT count(*) FROM attempts WHERE phase = 'tenant' AND granted = 2});
is($grants, '100', 'exactly 100 grants for the tenant bucket of 100');
is(level('multi.tenant', 'acme'), '0', 'the tenant bucket is empty');
my %user_grants = split /[|\n]/, $node->safe_psql(
	'postgres', q{
	SELECT u, count(*) FILTER (WHERE granted = 2) FROM attempts
	WHERE phase = 'tenant' GROUP BY u ORDER BY u});
my $charged = 0;
my @mismatch;
foreach my $u (1 .. 8)
{
	my $used = 1000 - level('multi.user', "acme/u$u");
	$charged += $used;
	push @mismatch, "u$u: charged $used, granted " . ($user_grants{$u} // 0)
	  if $used != ($user_grants{$u} // 0);
}
is($charged, 100, 'the user buckets were charged 100 times in all, as the tenant was');
is_deeply(\@mismatch, [], 'each user bucket charged exactly once per grant (no partial charges)');
cmp_ok(scalar(grep { $_ > 0 } values %user_grants), '>', 1, 'grants went to more than one user');

# The other way round: user buckets of 5 are the tight ones, the tenant has 1000.
# 8 users x 5 tokens: exactly 40 grants, and the tenant charged exactly 40 times.
pgbench(
	'consume_all_users', $clients, 5, q{
\set u :client_id % 8 + 1
INSERT INTO attempts
SELECT 'user', :u, count(*), count(*) FILTER (WHERE allowed), string_agg(DISTINCT source, ',')
FROM rl_consume_all(ARRAY['multi.user_small', 'multi.tenant_big'], ARRAY['beta/u' || :u, 'beta']);
});
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*) FROM attempts WHERE phase = 'user' AND (checks <> 2 OR granted NOT IN (0, 2) OR sources <> 'redis')}),
	'0', 'user-bound race: all or nothing, every time by Redis');
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM attempts WHERE phase = 'user' AND granted = 2}),
	'40', 'exactly 40 grants for 8 user buckets of 5');
is(level('multi.tenant_big', 'beta'), '960', 'the tenant bucket was charged exactly 40 times');
is( $node->safe_psql(
		'postgres', q{
	SELECT string_agg(DISTINCT g::text, ',') FROM (
	    SELECT count(*) FILTER (WHERE granted = 2) AS g FROM attempts WHERE phase = 'user' GROUP BY u) AS per_user}),
	'5', 'each user got exactly its 5');

#
# The trigger under concurrency: 16 clients insert rows for one subject.
#
my $trigger_clients = 16;

# One row per statement: exactly 50 rows for 50 tokens. A denial (RL429) is
# caught, so that pgbench goes on; its subtransaction refunds nothing (nothing was
# taken).
pgbench(
	'trigger_rows', $trigger_clients, 10, q{
DO $$
BEGIN
    INSERT INTO trig_rows (tenant) VALUES ('hot');
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    INSERT INTO denials VALUES ('rows');
END
$$;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM trig_rows}),
	'50', 'exactly 50 rows for a capacity of 50');
is($node->safe_psql('postgres', q{SELECT count(*) FROM denials WHERE what = 'rows'}),
	$trigger_clients * 10 - 50, 'every other insert was denied with RL429');
is(level('trig.rows', 'hot'), '0', 'the bucket is empty');

# Three rows per statement, charged row by row: a statement denied midway gives
# back what its first rows took. Rows come in whole statements, and rows plus
# what is left is exactly the capacity.
pgbench(
	'trigger_triples', $trigger_clients, 10, q{
DO $$
BEGIN
    INSERT INTO trig_triples (tenant) VALUES ('hot'), ('hot'), ('hot');
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    INSERT INTO denials VALUES ('triples');
END
$$;
});
my $triples = $node->safe_psql('postgres', q{SELECT count(*) FROM trig_triples});
is($triples % 3, 0, "rows of whole statements only ($triples rows)");
is($triples + level('trig.triples', 'hot'), 50,
	'rows + tokens left = 50: every denied statement gave back its rows\' tokens');
cmp_ok($triples, '>=', 3, 'some statements got through');

# Statement level, three rows per statement: one charge of 3 per statement, so
# 16 statements get through (48 rows) and 2 tokens stay.
pgbench(
	'trigger_statements', $trigger_clients, 10, q{
DO $$
BEGIN
    INSERT INTO trig_bulk (tenant) SELECT 'hot' FROM generate_series(1, 3);
EXCEPTION WHEN SQLSTATE 'RL429' THEN
    INSERT INTO denials VALUES ('bulk');
END
$$;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM trig_bulk}),
	'48', 'statement level: 16 statements of 3 rows for 50 tokens');
is(level('trig.bulk', 'hot'), '2', 'statement level: 2 tokens left');
is($node->safe_psql('postgres', q{SELECT count(*) FROM denials WHERE what = 'bulk'}),
	$trigger_clients * 10 - 16, 'every other statement was denied');

my $log = slurp_file($node->logfile);
unlike($log, qr/Redis cannot answer/, 'Redis answered every decision');
unlike($log, qr/not (?:have been )?refunded/, 'every refund reached Redis');
unlike($log, qr/server process .* was terminated/, 'no backend crashed');
unlike($log, qr/acme\/u\d|beta\/u\d/, 'no subject in the log');

$node->stop;
$redis->stop;
done_testing();
