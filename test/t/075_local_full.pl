
# A full table of local fallback buckets: with Redis down and every slot taken,
# a slot whose bucket has refilled completely is reused, and a subject that
# finds none is denied (source local, with a retry-after) rather than given a
# fresh bucket: the table can never grant more than the policy.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;

# The smallest table: 128 slots, 16 partitions of 8. A long retry_interval keeps
# the breaker open, so every decision below is a local one.
my $redis = redis_start(name => 'local_full');
my $node = rl_node('local_full', redis => $redis,
	conf => [ 'ratelimit.local_buckets = 128', "ratelimit.retry_interval = '10min'" ]);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('lf_slow', 2, 1, '1 day', 'local'),   -- never full again during the test
	  ('lf_coll', 2, 2, '1 s', 'local'),     -- full again (its slot free) a second after
	  ('lf_fast', 1, 1, '1 ms', 'local');    -- full again a millisecond after a take
	-- Decisions of policy p for subjects prefix1 .. prefixN.
	CREATE FUNCTION take_many(p text, prefix text, n int)
	RETURNS TABLE (subject text, allowed boolean, source text, retry_after_ms bigint)
	LANGUAGE sql AS $$
	    SELECT prefix || s, d.allowed, d.source, d.retry_after_ms
	    FROM generate_series(1, n) s, rl_consume(p, prefix || s) d
	$$;
});
$redis->stop;

sub row
{
	my ($sql) = @_;
	return [ split /\|/, $node->safe_psql('postgres', $sql) ];
}

# Subjects whose placing hashes collide (cut to 2 bits here, as a crafted subject's would)
# each have a bucket of their own: the keyed check tells them apart, so no subject can be
# made to share another's. Eight of them get 2 tokens each, then nothing.
my $round = q{SELECT count(*) FILTER (WHERE d.allowed) FROM generate_series(1, 8) s,
	rl_consume('lf_coll', 'collided' || s) d;};
is($node->safe_psql('postgres', "SET ratelimit.test_local_key_bits = 2; $round $round $round"), "8\n8\n0",
	'subjects whose placing hashes collide: a bucket each (2 tokens for each of 8, no third)');
$node->safe_psql('postgres', 'SELECT pg_sleep(1.1)');

# Fast buckets fill the table, refill, and their slots are reused. (600 subjects: with
# keys that hash differently in each installation, every partition of 8 slots gets 8
# subjects or more; 300 left one short about once in a dozen runs.)
is_deeply(row(q{SELECT count(*) FILTER (WHERE source = 'local'), bool_or(allowed)
	FROM take_many('lf_fast', 'a', 600)}),
	[ 600, 't' ], 'Redis down: 600 fast subjects decided by local buckets');
is_deeply(row(q{SELECT local_buckets, local_buckets_in_use FROM rl_health()}),
	[ 128, 128 ], 'every one of the 128 slots is in use');
$node->safe_psql('postgres', 'SELECT pg_sleep(0.05)');
my ($reused) = @{ row(q{SELECT count(*) FILTER (WHERE allowed) FROM take_many('lf_fast', 'b', 300)}) };
cmp_ok($reused, '>=', 128,
	"slots whose buckets refilled completely are reused by new subjects ($reused of 300 allowed)");

# Slow buckets take every slot and never give one up: the rest are denied.
$node->safe_psql('postgres', 'SELECT pg_sleep(0.05)');
$node->safe_psql('postgres',
	q{CREATE TABLE slow AS SELECT * FROM take_many('lf_slow', 's', 1000)});
my ($granted, $denied, $denied_local, $denied_wait) = @{
	row(q{SELECT count(*) FILTER (WHERE allowed), count(*) FILTER (WHERE NOT allowed),
	             count(*) FILTER (WHERE NOT allowed AND source = 'local'),
	             count(*) FILTER (WHERE NOT allowed AND retry_after_ms > 0)
	      FROM slow})
};
is($granted, 128, '1000 slow subjects: exactly one per slot is granted');
is_deeply([ $denied_local, $denied_wait ], [ $denied, $denied ],
	"the other $denied are denied by the local table, each with a retry-after");
is_deeply(row(q{SELECT count(*) FILTER (WHERE NOT d.allowed) FROM slow s, rl_consume('lf_slow', s.subject) d
	WHERE NOT s.allowed}),
	[ $denied ], 'asked again, they are still denied: no slot was freed');

# A subject with a slot gets exactly its capacity (2), never more.
is_deeply(row(q{SELECT count(*) FILTER (WHERE d.allowed) FROM slow s, rl_consume('lf_slow', s.subject) d
	WHERE s.allowed}),
	[ 128 ], 'each granted subject gets its second token');
is_deeply(row(q{SELECT count(*) FILTER (WHERE d.allowed) FROM slow s, rl_consume('lf_slow', s.subject) d
	WHERE s.allowed}),
	[ 0 ], 'and no third');

# A full table of buckets that are not full has nothing for another policy either.
is_deeply(row(q{SELECT count(*) FILTER (WHERE allowed), count(*) FILTER (WHERE source = 'local')
	FROM take_many('lf_fast', 'c', 100)}),
	[ 0, 100 ], 'fresh fast subjects find no reusable slot: all denied, by the local table');

done_testing();
