
# Upgrading never grants more: buckets that ratelimit 0.3.0's scripts wrote (a hash of
# level and time) are honoured after ALTER EXTENSION ratelimit UPDATE by every script that
# reads them — the lean one-bucket take of rl_consume, rl_peek and the group script of
# rl_consume_all — until they are written again in the string form; so is a sliding log as
# 0.8.0 wrote it (a member per token). An installation made at 0.3.0 keeps its keys (no
# installation id in them), so the old buckets are found.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use FindBin;
use Test::More;

use RateLimitTest;

my $redis = redis_start(name => 'upgrade_buckets');
my $node = rl_node('upgrade_buckets', redis => $redis, create_extension => 0);
$node->safe_psql('postgres', q{
	CREATE EXTENSION ratelimit VERSION '0.3.0';
	SELECT rl_define('up.one', 10, per => '1 hour');
	SELECT rl_define('up.two', 10, per => '1 hour');
});

# The key of policy's bucket for subject, as 0.3.0 and every version since build it.
sub key_of
{
	my ($policy, $subject) = @_;
	my $version = $node->safe_psql('postgres', "SELECT version FROM rl_policy WHERE name = '$policy'");
	return "rl:postgres:v$version:{$subject}:$policy";
}

# 10 per hour: refill 10 / 3,600,000 ms reduces to rate 1 unit per ms, 360,000 units a token.
my $unit = 360_000;
my $now_ms = sub { my ($s, $us) = split /\n/, $redis->cli('TIME'); return $s * 1000 + int($us / 1000) }->();
# Buckets as 0.3.0 left them: up.one at 2 tokens for 'alice', 1 token for tenant 'acme'.
for ([ key_of('up.one', 'alice'), 2 ], [ key_of('up.one', 'acme'), 1 ])
{
	my ($key, $tokens) = @$_;
	$redis->cli('HSET', $key, 'level', $tokens * $unit, 'time', $now_ms);
	$redis->cli('PEXPIRE', $key, 3_600_000);
}

# A role that may create in the extension's schema plants a look-alike of what 0.3.0 lacks:
# a table called rl_installation_seq, whose "id" would give every subject new, full buckets.
$node->safe_psql('postgres', q{
	CREATE ROLE planter LOGIN;
	GRANT CREATE ON SCHEMA public TO planter;
	SET ROLE planter;
	CREATE TABLE rl_installation_seq (last_value bigint);
	INSERT INTO rl_installation_seq VALUES (123456);
	RESET ROLE;
});
is($node->safe_psql('postgres', "SELECT allowed, remaining FROM rl_peek('up.one', 'alice', 3)"), 'f|2',
	'a look-alike rl_installation_seq is not the extension\'s: the keys stay, the 0.3.0 bucket is read');
$node->safe_psql('postgres', 'DROP TABLE rl_installation_seq');

$node->safe_psql('postgres', 'ALTER EXTENSION ratelimit UPDATE');
my ($version) = slurp_file("$FindBin::Bin/../../ratelimit.control") =~ /^default_version = '([^']+)'/m;
is($node->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'ratelimit'"),
	$version, "updated to $version with the old buckets live in Redis");
is(key_installation($node), '', 'an installation made at 0.3.0 keeps no id in its keys');

my $q = sub { $node->safe_psql('postgres', $_[0]) };
is($q->("SELECT allowed, remaining, source FROM rl_peek('up.one', 'alice', 3)"), 'f|2|redis',
	'rl_peek reads the 0.3.0 hash: 2 tokens, not a full bucket of 10');
is($q->("SELECT allowed, remaining, source FROM rl_consume('up.one', 'alice', 3)"), 'f|2|redis',
	'rl_consume (the lean take) of 3: denied, 2 left, as 0.3.0 left it');
is($redis->cli('TYPE', key_of('up.one', 'alice')), 'hash', 'a denial writes nothing: still the hash');
is($q->("SELECT allowed, remaining FROM rl_consume('up.one', 'alice', 2)"), 't|0',
	'rl_consume of 2: granted, 0 left');
is($redis->cli('TYPE', key_of('up.one', 'alice')), 'string', 'written again in the string form');
is($q->("SELECT allowed FROM rl_consume('up.one', 'alice', 1)"), 'f', 'and empty it stays');

is($q->("SELECT string_agg(allowed::text || ':' || remaining, ',') FROM "
		  . "rl_consume_all(ARRAY['up.one', 'up.two'], ARRAY['acme', 'acme/bob'], ARRAY[2, 1])"),
	'false:1,false:10', 'rl_consume_all (the group script) reads the hash: 1 token, a cost of 2 denies the group');
is($q->("SELECT string_agg(allowed::text || ':' || remaining, ',') FROM "
		  . "rl_consume_all(ARRAY['up.one', 'up.two'], ARRAY['acme', 'acme/bob'])"),
	'true:0,true:9', 'a cost of 1 each granted (nothing was taken by the denial before)');
is($redis->cli('TYPE', key_of('up.one', 'acme')), 'string', 'the group wrote it in the string form');

# A sliding log as 0.8.0's scripts wrote it, a member "<ms>:<n>" per token: 6 tokens of
# 10 an hour, taken a second ago. Read as one request holding the 6, then written anew.
$node->safe_psql('postgres', "SELECT rl_define('up.log', 10, per => '1 hour', algorithm => 'sliding_log')");
my $log = key_of('up.log', 'carol');
$redis->cli('ZADD', $log, map { ($now_ms - 1000, sprintf('%d:%d', $now_ms - 1000, $_)) } 1 .. 6);
$redis->cli('PEXPIRE', $log, 3_600_000);
is($q->("SELECT allowed, remaining, source FROM rl_peek('up.log', 'carol', 5)"), 'f|4|redis',
	'rl_peek reads 0.8.0\'s log of a member per token: 6 taken, 5 more do not fit');
is($redis->cli('ZCARD', $log), '6', 'a peek writes nothing: still 0.8.0\'s members');
is($q->("SELECT string_agg(allowed::text || ':' || remaining, ',') FROM "
		  . "rl_consume_all(ARRAY['up.log', 'up.two'], ARRAY['carol', 'carol'], ARRAY[5, 1])"),
	'false:4,false:10', 'rl_consume_all reads it too: a cost of 5 denies the group');
is($q->("SELECT allowed, remaining FROM rl_consume('up.log', 'carol', 4)"), 't|0', 'rl_consume of 4: granted, 0 left');
is($redis->cli('ZCARD', $log), '2', 'written anew: one member holding the 6, one for the 4');
is($q->("SELECT allowed FROM rl_consume('up.log', 'carol', 1)"), 'f', 'and full it stays');

$node->stop;
done_testing();
