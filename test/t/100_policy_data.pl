
# The data that lives in the database: policies, per-subject overrides, their
# versions and history survive pg_dump and a restore (custom and plain format)
# unchanged, so a restored database with the same key scope goes on with the
# same Redis buckets; an override committed in one session is used by every
# other session's next decision, and one with an expiry stops applying by
# itself on the real clock.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run ();
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'policy_data');
# One key scope for every database of the node (a superuser-only setting), so
# that a restored database reads the buckets of the one it came from.
my $node = rl_node('policy_data', redis => $redis,
	conf => ["ratelimit.key_scope = 'pd'"]);

# A fixed time for the buckets: nothing refills between the databases' decisions.
my $clock = 3000000000000;    # 2065-01-24 05:20:00 UTC
my $set_clock = "SET ratelimit.test_clock_ms = '$clock'";

# One decision in a new session of database db, on the test clock.
sub decide
{
	my ($db, $policy, $subject, $cost) = @_;
	return consume($node, $policy, $subject, $cost, db => $db, setup => $set_clock);
}

# Checks fields of decision d.
sub decision_is
{
	my ($d, $expect, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my %want = (source => 'redis', %$expect);
	is_deeply({ map { $_ => $d->{$_} } keys %want }, \%want, $name)
	  or diag explain $d;
}

# The rows of a query, one string per row (psql -At).
sub rows
{
	my ($db, $sql) = @_;
	return [ split /\n/, $node->safe_psql($db, $sql) ];
}

my $policies_sql = 'SELECT to_jsonb(p) FROM rl_policy p ORDER BY name';
my $overrides_sql = 'SELECT to_jsonb(o) FROM rl_override o ORDER BY policy, subject';
my $history_sql = 'SELECT to_jsonb(h) FROM rl_policy_history h ORDER BY at, id';

#
# (a) pg_dump and restore.
#
$node->safe_psql('postgres', 'CREATE DATABASE src');
$node->safe_psql(
	'src', qq{
	CREATE EXTENSION ratelimit;
	$set_clock;
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES
	  ('d.api', 10, 10, '1 day'),
	  ('d.gone', 3, 3, '1 hour');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES
	  ('d.lease', 'concurrency', 2, '1 minute');
	UPDATE rl_policy SET capacity = 12, refill_amount = 12 WHERE name = 'd.api';
	UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'd.lease';
	DELETE FROM rl_policy WHERE name = 'd.gone';
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES
	  ('d.gone', 4, 4, '1 hour');
	INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period, reason)
	  VALUES ('d.api', 'premium', 30, 30, '1 day', 'pays');
	INSERT INTO rl_override (policy, subject, action, reason) VALUES
	  ('d.api', 'vip', 'allow', 'ours'),
	  ('d.api', 'spammer', 'deny', 'abuse');
	INSERT INTO rl_override (policy, subject, action, expires_at) VALUES
	  ('d.gone', 'trial', 'deny', '2100-01-01 00:00:00+00');
	INSERT INTO rl_override (policy, subject, capacity) VALUES ('d.lease', 'big', 5);
	INSERT INTO rl_override (policy, subject, action) VALUES ('d.api', 'dropped', 'deny');
	DELETE FROM rl_override WHERE subject = 'dropped';
	UPDATE rl_override SET reason = 'pays more' WHERE subject = 'premium';
	UPDATE rl_override SET capacity = 40, refill_amount = 40 WHERE subject = 'premium';
});

my %v = map { split /\|/ } @{ rows('src', q{
	SELECT name, version FROM rl_policy
	UNION ALL SELECT policy || '/' || subject, version FROM rl_override}) };
ok(3 == grep({ defined $v{$_} } qw(d.api d.gone d.lease)), 'src: three policies');
my $versions = rows('src', q{
	SELECT v FROM (SELECT version AS v FROM rl_policy UNION SELECT version FROM rl_override
	               UNION SELECT (old->>'version')::int FROM rl_policy_history
	               UNION SELECT (new->>'version')::int FROM rl_policy_history) x
	WHERE v IS NOT NULL ORDER BY v});
my $max_version = $versions->[-1];
my $gaps = $node->safe_psql('src', q{
	SELECT count(*) FROM generate_series(1, (SELECT max(version) FROM rl_policy)) g
	WHERE g NOT IN (SELECT version FROM rl_policy)});
cmp_ok($gaps, '>', 0, 'src: the policies\' versions have gaps (changed, dropped, created again)');

# Tokens taken in the original database.
decision_is(decide('src', 'd.api', 'tenant_a', 7),
	{ remaining => 5, capacity => 12, version => $v{'d.api'} },
	'src: tenant_a takes 7 of 12');
decision_is(decide('src', 'd.api', 'premium', 25),
	{ remaining => 15, capacity => 40, version => $v{'d.api/premium'} },
	'src: premium takes 25 of its own 40');
decision_is(decide('src', 'd.gone', 'tenant_a', 1),
	{ remaining => 3, capacity => 4, version => $v{'d.gone'} },
	'src: d.gone (created again) takes 1 of 4');
decision_is(decide('src', 'd.api', 'spammer'),
	{ allowed => 'f', source => 'override' }, 'src: spammer is denied');

my @keys = $redis->scan_keys;
my $installation = key_installation($node, 'src');
is_deeply(
	[ sort grep { /\{(tenant_a|premium)\}/ } @keys ],
	[
		sort "rl:pd:v$v{'d.api'}$installation:{tenant_a}:d.api",
		"rl:pd:v$v{'d.api/premium'}$installation:{premium}:d.api",
		"rl:pd:v$v{'d.gone'}$installation:{tenant_a}:d.gone"
	],
	'src: keys prefix:scope:v<version>:{subject}:policy, the override\'s with its own version');

my $src_policies = rows('src', $policies_sql);
my $src_overrides = rows('src', $overrides_sql);
my $src_history = rows('src', $history_sql);
is(scalar @$src_overrides, 5, 'src: five overrides');
cmp_ok(scalar @$src_history, '>=', 15, 'src: every change is in the history');
my $src_max_id = $node->safe_psql('src', 'SELECT max(id) FROM rl_policy_history');

# Checks the n-th database restored from src (they share src's buckets: each
# takes from them in turn).
sub check_restored
{
	my ($db, $how, $n) = @_;
	my $remaining = 5 - $n;

	is_deeply(rows($db, $policies_sql), $src_policies,
		"$how: every policy, with its version");
	is_deeply(rows($db, $overrides_sql), $src_overrides,
		"$how: every override, with its version, expiry, reason and creation time");
	my %restored = map { $_ => 1 } @{ rows($db, $history_sql) };
	my @missing = grep { !$restored{$_} } @$src_history;
	is_deeply(\@missing, [],
		"$how: every history row, with its id, time, role, xid, action and rows");

	# Each bucket goes on from where the original database left it.
	decision_is(decide($db, 'd.api', 'tenant_a'),
		{ remaining => $remaining, capacity => 12, version => $v{'d.api'} },
		"$how: tenant_a's bucket goes on ($remaining left)");
	decision_is(decide($db, 'd.api', 'premium', 5),
		{ remaining => 15 - 5 * $n, capacity => 40,
		  version => $v{'d.api/premium'} },
		"$how: premium's own bucket goes on");
	decision_is(decide($db, 'd.gone', 'tenant_a'),
		{ remaining => 3 - $n, capacity => 4, version => $v{'d.gone'} },
		"$how: so does d.gone's");
	decision_is(decide($db, 'd.api', 'vip', 12),
		{ allowed => 't', remaining => 12, source => 'override' },
		"$how: the allow override applies");
	decision_is(decide($db, 'd.api', 'spammer'),
		{ allowed => 'f', retry_after_ms => 86400000, source => 'override' },
		"$how: the deny override applies");
	decision_is(decide($db, 'd.gone', 'trial'),
		{ allowed => 'f', retry_after_ms => 4102444800000 - $clock, source => 'override' },
		"$how: the expiring deny applies until its expiry");
	my $peek = parse_decision($node->safe_psql($db,
		"$set_clock; " . decision_sql('d.lease', 'big', 1, 'rl_peek')));
	decision_is($peek, { remaining => 5, capacity => 5, version => $v{'d.lease/big'} },
		"$how: the concurrency limit override applies");
	is_deeply([ sort grep { /\{(tenant_a|premium)\}/ } $redis->scan_keys ],
		[ sort grep { /\{(tenant_a|premium)\}/ } @keys ],
		"$how: no new key for them");

	# The counters go on above the old values.
	$node->safe_psql($db, qq{
		INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('d.new', 1, 1, '1 s');
		INSERT INTO rl_override (policy, subject, action) VALUES ('d.new', 'x', 'deny');
		UPDATE rl_policy SET capacity = 13 WHERE name = 'd.api';
	});
	my @new = @{ rows($db, q{
		SELECT version FROM (
			SELECT 1, version FROM rl_policy WHERE name = 'd.new'
			UNION ALL SELECT 2, version FROM rl_policy WHERE name = 'd.api'
			UNION ALL SELECT 3, version FROM rl_override WHERE policy = 'd.new') x(n, version)
		ORDER BY n}) };
	is(scalar(grep { $_ > $max_version } @new), 3,
		"$how: new versions are above every old one ($max_version)")
	  or diag "@new";
	my $new_ids = $node->safe_psql($db, q{
		SELECT min(id) FROM rl_policy_history
		WHERE name = 'd.new' OR (name = 'd.api' AND (new->>'capacity')::int = 13)});
	cmp_ok($new_ids, '>', $src_max_id, "$how: new history ids are above the old ones");
	# (A subject of its own: the other restored database has issued the same
	# version numbers since, to limits of its own, in the same key scope.)
	my $fresh = $how =~ s/\W/_/gr;
	decision_is(decide($db, 'd.api', $fresh),
		{ remaining => 12, capacity => 13, version => $new[1] },
		"$how: a changed policy starts a new bucket");
}

my $dump_dir = PostgreSQL::Test::Utils::tempdir();

# Custom format, pg_restore into a database made by createdb.
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dump_dir/src.dump", '-d', 'src' ],
	'pg_dump -Fc');
$node->command_ok([ 'createdb', 'restored_custom' ], 'createdb');
my $restored = $node->run_log(
	[ 'pg_restore', '--exit-on-error', '-d', 'restored_custom', "$dump_dir/src.dump" ]);
ok($restored, 'pg_restore exits 0');
check_restored('restored_custom', 'custom format', 1);

# Plain format: pg_dump | psql.
$node->command_ok([ 'createdb', 'restored_plain' ], 'createdb');
my @where = ('-h', $node->host, '-p', $node->port);
my ($out, $err) = ('', '');
my $piped = IPC::Run::run(
	[ 'pg_dump', @where, '-Fp', '-d', 'src' ], '|',
	[ 'psql', @where, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'restored_plain' ],
	'>', \$out, '2>', \$err, IPC::Run::timeout(120));
ok($piped, 'pg_dump | psql exits 0') or diag $err;
check_restored('restored_plain', 'plain format', 2);

# The original database shares the buckets too.
decision_is(decide('src', 'd.api', 'tenant_a'),
	{ remaining => 2, version => $v{'d.api'} },
	'src: tenant_a\'s bucket has what both restored databases took');

#
# (a2) A dump of 0.3.0, which has no installation id (its keys have none), restored into
# the current version: the restore keeps reading the keys its policies used, so a subject
# at 70 of 100 is still at 70, not granted as if full. An installation made now keeps its
# own id through a dump and restore as well (above).
#
$node->safe_psql('postgres', 'CREATE DATABASE old_030');
$node->safe_psql('old_030', q{
	CREATE EXTENSION ratelimit VERSION '0.3.0';
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('o.api', 100, 1, '1 day');
});
decision_is(decide('old_030', 'o.api', 'tenant_o', 30), { remaining => 70 },
	'0.3.0: tenant_o takes 30 of 100');
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dump_dir/old_030.dump", '-d', 'old_030' ],
	'pg_dump -Fc of the 0.3.0 database');
$node->command_ok([ 'createdb', 'restored_030' ], 'createdb');
ok($node->run_log([ 'pg_restore', '--exit-on-error', '-d', 'restored_030', "$dump_dir/old_030.dump" ]),
	'pg_restore of the 0.3.0 dump into the current version exits 0');
is($node->safe_psql('restored_030', q{SELECT extversion FROM pg_extension WHERE extname = 'ratelimit'}),
	$node->safe_psql('postgres', q{SELECT default_version FROM pg_available_extensions WHERE name = 'ratelimit'}),
	'the restore made the current version');
decision_is(decide('restored_030', 'o.api', 'tenant_o'), { remaining => 69 },
	'restored: tenant_o is still at 70 of 100 (the same key): 69 after one more');
# A policy made there afterwards makes the id its own; the old policy keeps its bucket.
$node->safe_psql('restored_030', q{SELECT rl_define('o.new', 5, per => '1 day')});
decision_is(decide('restored_030', 'o.api', 'tenant_o'), { remaining => 68 },
	'a new policy later changes nothing for the restored ones');

#
# (b) An override is used by another session's next decision once it commits.
#
$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('b.api', 5, 5, '1 day')});
my $bv = $node->safe_psql('postgres', q{SELECT version FROM rl_policy WHERE name = 'b.api'});
my $sa = session($node);
$sa->query_ok($set_clock);
decision_is($sa->consume('b.api', 's1'),
	{ remaining => 4, capacity => 5, version => $bv, stderr => '' },
	'session a decides by the policy (and caches it)');

my $sb = session($node);
$sb->query_ok(q{BEGIN; INSERT INTO rl_override (policy, subject, capacity, refill_amount, refill_period)
	VALUES ('b.api', 's1', 50, 50, '1 day')});
decision_is($sa->consume('b.api', 's1'),
	{ remaining => 3, capacity => 5, version => $bv },
	'an override not yet committed is not used');
$sb->query_ok('COMMIT');
my $ov = $node->safe_psql('postgres', q{SELECT version FROM rl_override WHERE subject = 's1'});
cmp_ok($ov, '>', $bv, 'the override has a version of its own');
decision_is($sa->consume('b.api', 's1'),
	{ remaining => 49, capacity => 50, version => $ov },
	'once committed, session a uses it at its next decision');

$sb->query_ok(q{BEGIN; UPDATE rl_override SET action = 'deny', capacity = NULL, refill_amount = NULL,
	refill_period = NULL WHERE subject = 's1'});
decision_is($sa->consume('b.api', 's1'),
	{ remaining => 48, capacity => 50, version => $ov },
	'an uncommitted change of the override is not used');
$sb->query_ok('COMMIT');
decision_is($sa->consume('b.api', 's1'),
	{ allowed => 'f', retry_after_ms => 86400000, source => 'override' },
	'the committed change is');

$sb->query_ok(q{BEGIN; DELETE FROM rl_override WHERE subject = 's1'});
decision_is($sa->consume('b.api', 's1'),
	{ allowed => 'f', source => 'override' },
	'an uncommitted delete is not used');
$sb->query_ok('ROLLBACK');
decision_is($sa->consume('b.api', 's1'),
	{ allowed => 'f', source => 'override' },
	'nor a rolled-back one');
$sb->query_ok(q{DELETE FROM rl_override WHERE subject = 's1'});
decision_is($sa->consume('b.api', 's1'),
	{ allowed => 't', remaining => 2, capacity => 5, version => $bv },
	'deleted: session a is back on the policy\'s bucket');

# A session inside a REPEATABLE READ transaction sees the commit as well.
$sa->query_ok('BEGIN ISOLATION LEVEL REPEATABLE READ');
is($sa->query_ok(q{SELECT count(*) FROM rl_override WHERE policy = 'b.api'}), '0',
	'session a takes a snapshot without overrides');
$sb->query_ok(q{INSERT INTO rl_override (policy, subject, action) VALUES ('b.api', 's1', 'allow')});
decision_is($sa->consume('b.api', 's1', 5),
	{ allowed => 't', remaining => 5, source => 'override' },
	'inside it, the committed override is used all the same');
$sa->query_ok('COMMIT');

#
# (c) An override that expires stops applying by itself (the real clock).
#
my $sc = session($node);
$sc->query_ok(q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period)
	VALUES ('c.api', 5, 5, '1 day')});
$sc->query_ok(q{INSERT INTO rl_override (policy, subject, action, expires_at)
	VALUES ('c.api', 'temp', 'deny', now() + interval '2 seconds')});
my $row_sql = q{SELECT to_jsonb(o) FROM rl_override o WHERE policy = 'c.api'};
my $row_before = $sc->query_ok($row_sql);
my $history_before = $sc->query_ok('SELECT count(*) FROM rl_policy_history');
my $poll = q{SELECT d.allowed, d.retry_after_ms, d.source, clock_timestamp() >= o.expires_at
	FROM rl_consume('c.api', 'temp') d, rl_override o
	WHERE o.policy = 'c.api' AND o.subject = 'temp'};
my ($allowed, $retry, $source, $past) = split /\|/, $sc->query_ok($poll);
is_deeply([ $allowed, $source, $past ], [ 'f', 'override', 'f' ], 'the new override denies');
ok($retry > 0 && $retry <= 2000, "until it expires ($retry ms)");
my $deadline = time + 10;
my @seen;
while (time < $deadline)
{
	($allowed, $retry, $source, $past) = split /\|/, $sc->query_ok($poll);
	push @seen, $source;
	last if $source ne 'override';
	usleep(100_000);
}
is_deeply([ $allowed, $source ], [ 't', 'redis' ],
	'once expired, the policy decides again, in the same session')
  or diag "@seen";
is($past, 't', 'and not before expires_at');
decision_is($sc->consume('c.api', 'temp'), { allowed => 't', remaining => 3 },
	'and counts');
my $sd = session($node);
decision_is($sd->consume('c.api', 'temp'), { allowed => 't', remaining => 2 },
	'as does a new session');
is($sc->query_ok($row_sql), $row_before, 'the row was not changed');
is($sc->query_ok('SELECT count(*) FROM rl_policy_history'), $history_before,
	'nothing was written');

$_->quit for ($sa, $sb, $sc, $sd);
$node->stop;
$redis->stop;
done_testing();
