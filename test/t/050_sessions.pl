
# Policies are cached per backend, yet a change is used by every session from
# the moment it commits: already-connected sessions, one inside a long
# REPEATABLE READ transaction, and not before the commit.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;

my $redis = redis_start(name => 'sessions');
my $node = rl_node('sessions', redis => $redis);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('p', 10, 10, '1 day', 'closed'),
	  ('q', 10, 10, '1 day', 'closed');
});

sub version_of
{
	my ($name) = @_;
	return $node->safe_psql('postgres',
		'SELECT version FROM rl_policy WHERE name = ' . quote_literal($name));
}

# Checks fields of decision d.
sub decision_is
{
	my ($d, $expect, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my %want = (source => 'redis', stderr => '', %$expect);
	is_deeply({ map { $_ => $d->{$_} } keys %want }, \%want, $name)
	  or diag explain $d;
}

# Session a has cached the policies before anything changes.
my $sa = session($node);
my $v1 = version_of('p');
decision_is($sa->consume('p', 's1'),
	{ version => $v1, capacity => 10, remaining => 9 },
	'session a decides with version 1 of p');

# Session r is inside a REPEATABLE READ transaction with a snapshot taken.
my $r = session($node);
$r->query_ok('BEGIN ISOLATION LEVEL REPEATABLE READ');
is($r->query_ok(q{SELECT capacity FROM rl_policy WHERE name = 'p'}),
	'10', 'session r takes its snapshot');
decision_is($r->consume('p', 's2'),
	{ version => $v1, capacity => 10, remaining => 9 },
	'session r decides with version 1 of p');

# A change that is not committed is not used.
my $writer = session($node);
$writer->query_ok(q{BEGIN; UPDATE rl_policy SET capacity = 20 WHERE name = 'p'});
decision_is($sa->consume('p', 's1'),
	{ version => $v1, capacity => 10, remaining => 8 },
	'an uncommitted change is not used');
$writer->query_ok('ROLLBACK');
decision_is($sa->consume('p', 's1'),
	{ version => $v1, capacity => 10, remaining => 7 },
	'nor after it rolls back');

# Committed: capacity 20, a new version, a new bucket.
$node->safe_psql('postgres', q{UPDATE rl_policy SET capacity = 20 WHERE name = 'p'});
my $v2 = version_of('p');
cmp_ok($v2, '>', $v1, 'a capacity change bumps the version');
decision_is($sa->consume('p', 's1'),
	{ version => $v2, capacity => 20, remaining => 19 },
	'session a uses the committed change at its next decision (new bucket)');
decision_is($r->consume('p', 's2'),
	{ version => $v2, capacity => 20, remaining => 19 },
	'so does session r, inside its REPEATABLE READ transaction');
is($r->query_ok(q{SELECT capacity FROM rl_policy WHERE name = 'p'}),
	'10', 'whose snapshot still shows the old row');

# A second change while r's transaction goes on.
$node->safe_psql('postgres',
	q{UPDATE rl_policy SET refill_amount = 30, capacity = 30 WHERE name = 'p'});
my $v3 = version_of('p');
cmp_ok($v3, '>', $v2, 'another change, another version');
decision_is($r->consume('p', 's2'),
	{ version => $v3, capacity => 30, remaining => 29 },
	'session r sees that one too, still in the same transaction');
is($r->query_ok(q{SELECT capacity FROM rl_policy WHERE name = 'p'}),
	'10', 'still the same snapshot');
$r->query_ok('COMMIT');

# The versions are part of the keys: one bucket per version.
my @keys = grep { /\{s1\}:p$/ } $redis->scan_keys;
is_deeply(
	[ sort map { /:v(\d+)(?:\.[0-9a-z]+)?:/ ? $1 : () } @keys ],
	[ sort ($v1, $v2) ],
	'one key per version that took tokens from s1');

# A change of fail_mode alone keeps the version (and the bucket).
my $vq = version_of('q');
decision_is($sa->consume('q', 's1'), { version => $vq, remaining => 9 },
	'session a decides with policy q');
$node->safe_psql('postgres', q{UPDATE rl_policy SET fail_mode = 'open' WHERE name = 'q'});
is(version_of('q'), $vq, 'a fail_mode change keeps the version');
decision_is($sa->consume('q', 's1'), { version => $vq, remaining => 8 },
	'session a keeps the version and the bucket');
# ... but the new fail mode is used: point session a at a port nothing listens on.
my $closed_port = PostgreSQL::Test::Cluster::get_free_port();
$sa->query_ok(
	"SET ratelimit.redis_url = 'redis://127.0.0.1:$closed_port'");
my $down = $sa->consume('q', 's1');
is_deeply([ @$down{qw(allowed source version)} ],
	[ 't', 'fail_open', $vq ], 'and uses the new fail mode');
is($sa->consume('p', 's1')->{source}, 'fail_closed', 'while p stays closed');
$sa->query_ok('RESET ratelimit.redis_url');

# A version set by hand is ignored.
$node->safe_psql('postgres', q{UPDATE rl_policy SET version = 999999 WHERE name = 'q'});
is(version_of('q'), $vq, 'the version cannot be set by hand');

# A new policy is found by a session that had cached the others.
$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('n', 5, 5, '1 day')});
decision_is($sa->consume('n', 's1'),
	{ version => version_of('n'), capacity => 5, remaining => 4 },
	'a policy inserted later is used at once');

# DELETE: the next decision of another session fails with 42704.
$node->safe_psql('postgres', q{DELETE FROM rl_policy WHERE name = 'p'});
my $gone = $sa->consume('p', 's1');
is(sqlstate_of($gone->{stderr}), '42704', 'a deleted policy is unknown (42704)')
  or diag $gone->{stderr};
like($gone->{stderr}, qr/policy "p" does not exist/, 'by name');
$r->query_ok('BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1');
$gone = $r->consume('p', 's2');
is(sqlstate_of($gone->{stderr}), '42704', 'also inside a REPEATABLE READ transaction');
$r->query('ROLLBACK');

# Deleted and created again: a version never used before.
$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('p', 10, 10, '1 day')});
my $v4 = version_of('p');
ok(!(grep { $_ == $v4 } ($v1, $v2, $v3)), 'a policy created again gets a new version');
decision_is($sa->consume('p', 's1'),
	{ version => $v4, capacity => 10, remaining => 9 },
	'and a fresh bucket');

# A rolled-back DELETE leaves the policy in use.
$writer->query_ok(q{BEGIN; DELETE FROM rl_policy WHERE name = 'p'});
decision_is($sa->consume('p', 's1'), { version => $v4, remaining => 8 },
	'a DELETE not yet committed is not used');
$writer->query_ok('ROLLBACK');
decision_is($sa->consume('p', 's1'), { version => $v4, remaining => 7 },
	'nor one rolled back');

# A transaction that holds rl_policy exclusively (an uncommitted TRUNCATE) stalls no
# decision: a session with a cache decides by it (the TRUNCATE is not committed), and
# one without a cache gives up after command_timeout with 55P03.
$node->safe_psql('postgres', q{UPDATE rl_policy SET fail_mode = 'closed' WHERE name = 'q'});
$writer->query_ok("SET client_min_messages = warning; BEGIN; TRUNCATE rl_policy CASCADE");
my ($elapsed, $held) = timed(sub { $sa->consume('p', 's1') });
is_deeply([ @$held{qw(source stderr)} ], [ 'redis', '' ],
	'while TRUNCATE is uncommitted, a session with a (stale) cache still decides')
  or diag explain $held;
cmp_ok($elapsed, '<', 0.5, 'without queueing for the lock');
my $newcomer = session($node);
$newcomer->query_ok("SET ratelimit.command_timeout = '300ms'");
($elapsed, $held) = timed(sub { $newcomer->consume('p', 's3') });
is(sqlstate_of($held->{stderr}), '55P03', 'a session without a cache: 55P03')
  or diag $held->{stderr};
cmp_ok($elapsed, '<', 1.3, 'within a second of command_timeout');
$writer->query_ok('ROLLBACK');
is($newcomer->consume('p', 's3')->{source}, 'redis', 'once the lock is gone it decides');
$newcomer->quit;

# TRUNCATE is a change too.
$node->safe_psql("postgres", "SET client_min_messages = warning; TRUNCATE rl_policy CASCADE");
is(sqlstate_of($sa->consume('n', 's1')->{stderr}), '42704', 'TRUNCATE empties every cache');

$_->quit for ($sa, $r, $writer);
$node->stop;
$redis->stop;
done_testing();
