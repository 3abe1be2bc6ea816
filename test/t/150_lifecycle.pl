# The life of an installation: dropped and created again, dumped and restored, its
# policy caches under a flood of invalidations, read on a hot standby.
#  - DROP EXTENSION + CREATE EXTENSION never reads the buckets of the old one;
#  - pg_dump/pg_restore keeps the installation (the same buckets) and the history with
#    its ids, unique and increasing, and records nothing twice;
#  - a flood of invalidations (temporary tables created and dropped in a loop) does not
#    make a busy backend reload its policies, but a real change still reaches it;
#  - a hot standby decides from the same buckets as its primary.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'lifecycle');
my $node = rl_node('lifecycle', redis => $redis, allows_streaming => 1,
	conf => [ 'ratelimit.key_scope = shop' ]);

# allowed|remaining|version|source of one decision in database db.
sub decide
{
	my ($db, $policy, $subject, $cost) = @_;
	return $node->safe_psql($db // 'postgres',
		sprintf('SELECT allowed, remaining, version, source FROM rl_consume(%s, %s, %d)',
			quote_literal($policy), quote_literal($subject), $cost // 1));
}

###
### (6) Dropped and created again: versions start again, buckets do not.
###

$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p', 1, 1, '1 day')});
my $old_version = $node->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'p'});
like(decide('postgres', 'p', 'tenant_1'), qr/^t\|0\|\d+\|redis$/, 'capacity 1: the one token is taken');
like(decide('postgres', 'p', 'tenant_1'), qr/^f\|0\|\d+\|redis$/, 'and the next call is denied');
my $old_installation = key_installation($node);

$node->safe_psql('postgres', 'DROP EXTENSION ratelimit CASCADE');
$node->safe_psql('postgres', 'CREATE EXTENSION ratelimit');
$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p', 100, 100, '1 day')});
my $new_version = $node->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'p'});
is($new_version, $old_version, 'the new installation numbers its versions from the start again');
isnt(key_installation($node), $old_installation, 'but it is another installation, with another id');
is(decide('postgres', 'p', 'tenant_1'), "t|99|$new_version|redis",
	'capacity 100: a full bucket of its own, not the old one (which read "f, 0" before 0.4)');
my @keys = grep { /\{tenant_1\}:p$/ } $redis->scan_keys;
is(scalar @keys, 2, 'two keys for the subject: the old installation\'s and the new one\'s');

###
### (6, 13) pg_dump and pg_restore: the same installation, the same buckets, the
### history as it was with its ids.
###

$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('q', 10, 10, '1 day');
	UPDATE rl_policy SET capacity = 20, refill_amount = 20 WHERE name = 'q';
	INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
	VALUES ('q', 'premium', 50, 50, '1 day');
	UPDATE rl_override SET reason = 'pays more' WHERE subject = 'premium';
});
is(decide('postgres', 'q', 'tenant_2', 5), 't|15|' . $node->safe_psql('postgres',
		q{SELECT version FROM rl_policy WHERE name = 'q'}) . '|redis', 'q: 5 of 20 taken');
my $history_sql = q{SELECT id, action, object, name, coalesce(subject, '') FROM rl_policy_history ORDER BY id};
my $source_history = $node->safe_psql('postgres', $history_sql);
my $dump = PostgreSQL::Test::Utils::tempdir() . '/lifecycle.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], 'pg_restore');

is(key_installation($node, 'restored'), key_installation($node),
	'the restored database is the same installation');
is(decide('restored', 'q', 'tenant_2', 5), 't|10|' . $node->safe_psql('restored',
		q{SELECT version FROM rl_policy WHERE name = 'q'}) . '|redis',
	'and reads the same bucket: 15 left there, 10 after 5 more');
is($node->safe_psql('restored', $history_sql), $source_history,
	'the history comes back as it was, with its ids, and nothing recorded twice');
is($node->safe_psql('restored', q{SELECT count(*) = count(DISTINCT id) FROM rl_policy_history}), 't',
	'history ids are unique');
$node->safe_psql('restored', q{UPDATE rl_policy SET capacity = 30, refill_amount = 30 WHERE name = 'q'});
is($node->safe_psql('restored', q{
	SELECT id > (SELECT max(id) FROM rl_policy_history WHERE action <> 'UPDATE' OR name <> 'q' OR new->>'capacity' <> '30')
	FROM rl_policy_history WHERE name = 'q' AND new->>'capacity' = '30'}), 't',
	'a change after the restore gets an id above every restored one');

# Only the rows a restore brings back go unrecorded: in a new database (an empty
# history), a superuser's insert that keeps its version, and a plain one after it in the
# same transaction, which is recorded.
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION ratelimit');
$node->safe_psql('fresh', q{
	BEGIN;
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, version)
	VALUES ('kept', 10, 10, '1 day', 500);
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period)
	VALUES ('plain', 10, 10, '1 day');
	COMMIT;
});
is($node->safe_psql('fresh', q{SELECT string_agg(action || ' ' || name, ', ' ORDER BY id) FROM rl_policy_history}),
	'INSERT plain', 'a row inserted as a restore does is not recorded; the next one is');

###
### (15) A flood of invalidations does not make a busy backend reload its policies.
###

my $overrides = 20_000;
$node->safe_psql('postgres', qq{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('flood.p', 1000000, 1000000, '1 second');
	INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
	SELECT 'flood.p', 'sub_' || g, 10, 10, '1 second' FROM generate_series(1, $overrides) g;
});
my $victim = session($node);
# The first decision loads every policy and override: what each reset cost before 0.4.
my $load_ms = $victim->query_ok(q{
	SELECT round(extract(epoch FROM clock_timestamp() - t) * 1000, 1)
	FROM (SELECT clock_timestamp() AS t) s, LATERAL rl_consume('flood.p', 'tenant_x') d});
note "loading the policy cache with $overrides overrides took $load_ms ms";
$victim->query_ok('BEGIN');
$victim->query_ok(q{SELECT rl_consume('flood.p', 'tenant_x')});
my $scans_before = $victim->query_ok(q{SELECT pg_stat_get_xact_numscans('rl_override'::regclass)});

# A flood of invalidations while the victim is busy (waiting for a lock, so not reading
# its queue): it falls behind, and its caches are reset (PostgreSQL says so at DEBUG4).
my $flooder = session($node);
sub flood_while_victim_waits
{
	my ($change) = @_;
	$flooder->query_ok('SELECT pg_advisory_lock(150)');
	$victim->start_query('SELECT pg_advisory_lock(150)');
	ok($node->poll_query_until('postgres',
		"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = " . $victim->pid),
		'the victim waits for a lock');
	$flooder->query_ok($change) if $change;
	$flooder->query_ok(q{
		DO $$ BEGIN
			FOR i IN 1 .. 1500 LOOP
				CREATE TEMP TABLE flood_t (a int);
				DROP TABLE flood_t;
			END LOOP;
		END $$});
	$flooder->query_ok('SELECT pg_advisory_unlock(150)');
	my (undef, $waited) = $victim->wait_result;
	my (undef, $unlocked) = $victim->query('SELECT pg_advisory_unlock(150)');
	return $waited . $unlocked;
}
$victim->query_ok('SET client_min_messages = debug4');
my $debug = flood_while_victim_waits();
my (undef, $decided) = $victim->query(q{SELECT rl_consume('flood.p', 'tenant_x')});
$victim->query('RESET client_min_messages');
like($debug . $decided, qr/cache state reset/,
	'the flood overflowed the invalidation queue: the caches were reset');
my $scans_after = $victim->query_ok(q{SELECT pg_stat_get_xact_numscans('rl_override'::regclass)});
is($scans_after, $scans_before,
	'after the reset, the decision did not read rl_override again: the generation had not moved');

# A real change during such a flood is still seen.
flood_while_victim_waits(q{UPDATE rl_policy SET capacity = 2000000 WHERE name = 'flood.p'});
is($victim->query_ok(q{SELECT capacity FROM rl_consume('flood.p', 'tenant_x')}), '2000000',
	'a change committed during the flood is seen (the generation moved: the cache is reloaded)');
cmp_ok($victim->query_ok(q{SELECT pg_stat_get_xact_numscans('rl_override'::regclass)}), '>', $scans_after,
	'and that took a reload');
$victim->query_ok('COMMIT');

# What a busy backend pays per decision while the flood goes on (each create and drop
# committed on its own, as a careless application would), for the record.
$flooder->start_query('CREATE TEMP TABLE flood_t (a int); DROP TABLE flood_t; ' x 3000);
my (undef, $timing) = $victim->query(q{
	DO $$
	DECLARE
		took float8[] := '{}';
		t timestamptz;
	BEGIN
		FOR i IN 1 .. 10 LOOP
			PERFORM pg_sleep(0.3);
			t := clock_timestamp();
			PERFORM rl_consume('flood.p', 'tenant_x');
			took := took || extract(epoch FROM clock_timestamp() - t) * 1000;
		END LOOP;
		RAISE NOTICE 'median % ms, max % ms',
			round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM unnest(took) x)::numeric, 3),
			round((SELECT max(x) FROM unnest(took) x)::numeric, 3);
	END $$});
$flooder->wait_result(120);
my ($median, $max) = ($timing // '') =~ /median ([\d.]+) ms, max ([\d.]+) ms/;
ok(defined $median, 'decisions during a flood were timed');
note "decisions of a busy backend during a flood, $overrides overrides: median "
  . ($median // '?') . ' ms, max ' . ($max // '?') . " ms (a reload costs $load_ms ms)";

###
### (16) A hot standby decides from the same buckets as its primary.
###

$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('rep.p', 10, 10, '1 day')});
$node->backup('lifecycle_backup');
my $standby = PostgreSQL::Test::Cluster->new('lifecycle_standby');
$standby->init_from_backup($node, 'lifecycle_backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
my $version = $node->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'rep.p'});
is($node->safe_psql('postgres', q{SELECT remaining FROM rl_consume('rep.p', 'tenant_r', 3)}), '7',
	'the primary takes 3 of 10');
is($standby->safe_psql('postgres',
	q{SELECT allowed, remaining, version, source FROM rl_consume('rep.p', 'tenant_r', 2)}),
	"t|5|$version|redis", 'the standby takes 2 from the same bucket: 5 left');
is($node->safe_psql('postgres', q{SELECT remaining FROM rl_peek('rep.p', 'tenant_r')}), '5',
	'and the primary sees it');
# A change of the policy reaches the standby when it is replayed.
$node->safe_psql('postgres', q{UPDATE rl_policy SET capacity = 20, refill_amount = 20 WHERE name = 'rep.p'});
my $changed = $node->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'rep.p'});
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT capacity, version FROM rl_consume('rep.p', 'tenant_r')}),
	"20|$changed", 'once replayed, the standby decides with the new version');

done_testing();
