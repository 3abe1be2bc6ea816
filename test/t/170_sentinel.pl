
# Redis Sentinel (redis-sentinel://), against a real master, a real replica and
# three real sentinels, all with ACL users: the data nodes' least-privilege
# user, and a sentinel user that may only ask for the master. The master is
# found through the sentinels and confirmed with ROLE; the exact-grant race
# holds; under pgbench load, SENTINEL FAILOVER and then kill -9 of the master
# bring decisions back to Redis on the new master within seconds (measured),
# with no error beyond the fail modes; the old master, restarted empty, never
# decides again; and a policy of capacity 100 shows what a failover can grant
# beyond the capacity (Redis replicates asynchronously).

use strict;
use warnings;

use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $admin_pw = 'admin-170-Xq';
my $user_pw = 'user-170-Wk';
my $watch_pw = 'watch-170-Pz';
# The least-privilege data user of docs/operations.md (database 0: no SELECT), and ROLE.
my @data_acl = (
	[ 'admin', 'on', ">$admin_pw", '~*', '&*', '+@all' ],
	[
		'ratelimit', 'on', ">$user_pw", 'resetkeys', '~rl:*', 'resetchannels', '-@all',
		'+evalsha', '+eval', '+time', '+get', '+set', '+hmget', '+del', '+pexpire',
		'+zcount', '+zscore', '+zrem', '+zremrangebyscore', '+zadd', '+zrange',
		'+zrangebyscore', '+zrevrangebyscore', '+role'
	]);
# Replicas authenticate as admin; a full sync starts at once (not after 5 s).
my @replication =
  ('--masteruser', 'admin', '--masterauth', $admin_pw, '--repl-diskless-sync-delay', 0);

my $master = redis_start(name => 'sen_master', acl => \@data_acl, args => [@replication]);
my $replica = redis_start(
	name => 'sen_replica',
	acl => \@data_acl,
	args => [ @replication, '--replicaof', '127.0.0.1', $master->port ]);

# Sentinels: the default user off, an administrator they speak to each other as, and
# a watcher that may only ask for the master.
my @sentinels = map {
	sentinel_start(
		name => "s$_",
		master_port => $master->port,
		down_after_ms => 1000,
		failover_timeout_ms => 5000,
		cli_args => [ '--user', 'admin', '--pass', $admin_pw, '--no-auth-warning' ],
		conf => [
			"sentinel auth-user mymaster admin",
			"sentinel auth-pass mymaster $admin_pw",
			"user admin on >$admin_pw +\@all",
			"user watcher on >$watch_pw -\@all +sentinel|get-master-addr-by-name",
			"user default off",
			"sentinel sentinel-user admin",
			"sentinel sentinel-pass $admin_pw",
		])
} 1 .. 3;

# The replica is in sync, and the sentinels know it and each other, before anything
# fails over.
my $deadline = time + 30;
usleep(50_000) until $replica->cli('INFO', 'replication') =~ /master_link_status:up/
  || time > $deadline;
like($replica->cli('INFO', 'replication'), qr/master_link_status:up/, 'the replica is in sync');
until (
	(grep {
			my $info = $_->cli('SENTINEL', 'master', 'mymaster');
			$info =~ /\bnum-slaves\n1\n/ && $info =~ /\bnum-other-sentinels\n2\n/
	} @sentinels) == 3)
{
	die 'the sentinels did not find the replica and each other' if time > $deadline;
	usleep(100_000);
}

my $dir = PostgreSQL::Test::Utils::tempdir();
my $watch_file = "$dir/sentinel.password";
append_to_file($watch_file, "$watch_pw\n");
chmod 0600, $watch_file;

my $url = "redis-sentinel://ratelimit:$user_pw\@" . join(',', map { $_->address } @sentinels)
  . '/mymaster?sentinel_user=watcher';
my $node = rl_node(
	'sentinel',
	url => $url,
	max_connections => 140,
	conf => [
		"ratelimit.sentinel_password_file = '$watch_file'",
		"ratelimit.retry_interval = '200ms'",
		"ratelimit.sentinel_check_interval = '100ms'",
		"ratelimit.command_timeout = '1s'",
	]);
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('sen.race', 100, 1, '1 day', 'closed'),
	  ('sen.load', 1000000000, 1000000000, '1 second', 'closed'),
	  ('sen.cap', 100, 1, '1 day', 'closed');
	CREATE TABLE grants (pid int);
});

# The port of the master that the sentinels name now (the first sentinel's view).
sub named_master { return $sentinels[0]->master_port }

# The number of script calls node n has run.
sub script_calls
{
	my ($n) = @_;
	return $n->command_calls('evalsha') + $n->command_calls('eval');
}

###
### Found through the sentinels, confirmed with ROLE.
###

my $s = session($node);
my $d = $s->consume('sen.load', 'probe');
is_deeply([ @$d{qw(allowed source stderr)} ], [ 't', 'redis', '' ],
	'redis-sentinel://: decided by Redis, with the sentinel user and the data user')
  or diag explain $d;
my $h = health($s);
is($h->{node}, '127.0.0.1:' . $master->port . ' (master of the sentinels)',
	'rl_health().node is the master the sentinels name');
cmp_ok(script_calls($master), '>', 0, 'the master ran the script');
is(script_calls($replica), 0, 'the replica ran nothing');

# The exact-grant race: 100 sessions, 100 tokens.
append_to_file("$dir/race.sql", q{
INSERT INTO grants SELECT pg_backend_pid() WHERE (rl_consume('sen.race', 'tenant_1', 1)).allowed;
});
run_pgbench($node, 'race', "$dir/race.sql", 100, 3);
is($node->safe_psql('postgres', 'SELECT count(*) FROM grants'), '100',
	'exactly 100 grants for 100 tokens, 100 sessions racing through Sentinel');

###
### A failover under load: decisions come back to Redis, on the new master.
###

append_to_file("$dir/load.sql", q{
\set s random(1, 100000)
SELECT rl_consume('sen.load', 'tenant_' || :s);
});

# Starts pgbench in the background for seconds; returns its handle and output refs.
sub load_start
{
	my ($seconds) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-h', $node->host, '-p', $node->port, '-c', 8, '-j', 2,
			'-T', $seconds, '-f', "$dir/load.sql", 'postgres'
		],
		'<', \undef, '>', \$out, '2>', \$err);
	return [ $h, \$out, \$err ];
}

sub load_finish
{
	my ($load, $what) = @_;
	my ($h, $out, $err) = @$load;
	my $ok = eval { $h->finish; 1 } && $h->result == 0;
	note "pgbench during $what:\n$$out\n$$err";
	ok($ok, "$what: pgbench under load exits 0");
	unlike($$out . $$err, qr/ERROR|FATAL|aborted/,
		"$what: no transaction failed (only the fail modes decided while Redis could not)");
}

# Polls with decisions of policy (every 20 ms, for at most timeout s) until one is
# decided by Redis on the master at port; returns the seconds it took and the
# sources seen meanwhile.
sub until_redis_on
{
	my ($policy, $port, $timeout) = @_;
	my $start = time;
	my %sources;
	while (time - $start < $timeout)
	{
		my $d = $s->consume($policy, 'probe');
		$sources{ $d->{source} // 'error' }++;
		return (time - $start, \%sources)
		  if ($d->{source} // '') eq 'redis'
		  && health($s)->{node} =~ /^127\.0\.0\.1:$port /;
		usleep(20_000);
	}
	return (undef, \%sources);
}

# Takes tokens of sen.cap (capacity 100, no refill) until 40 denials in a row;
# returns the grants.
sub take_all_cap
{
	my ($grants) = @_;
	my $denied = 0;
	while ($denied < 40)
	{
		my $d = $s->consume('sen.cap', 'tenant_cap');
		if ($d->{allowed} eq 't' && $d->{source} eq 'redis') { $grants++; $denied = 0 }
		else { $denied++ }
		usleep(5_000);
	}
	return $grants;
}

# 60 of sen.cap's 100 tokens before the failover.
my $cap_grants = 0;
for (1 .. 60)
{
	$cap_grants++ if $s->consume('sen.cap', 'tenant_cap')->{allowed} eq 't';
}
is($cap_grants, 60, 'sen.cap: 60 of its 100 tokens taken before the failover');

my $old = $master;
my $new = $replica;
my $load = load_start(6);
usleep(1_000_000);
my $failover_at = time;
$sentinels[0]->cli('SENTINEL', 'FAILOVER', 'mymaster');
# sen.cap goes on being taken, as an application would, until the sentinels name
# the new master: until then the old one is the master Sentinel names.
my $during = 0;
my $switched_at;
my $polled_at = 0;
while (time - $failover_at < 20)
{
	my $d = $s->consume('sen.cap', 'tenant_cap');
	$during++ if $d->{allowed} eq 't' && $d->{source} eq 'redis';
	if (time - $polled_at > 0.05)
	{
		$polled_at = time;
		if (named_master() == $new->port)
		{
			$switched_at = time;
			last;
		}
	}
	usleep(10_000);
}
ok(defined $switched_at, 'the sentinels name the replica');
note sprintf('SENTINEL FAILOVER: the sentinels named the new master %.2f s after the failover began',
	$switched_at - $failover_at);
# Once they do, a check (every 100 ms here) moves each connection: nothing more
# goes to the old master.
usleep(300_000);
my $old_calls = script_calls($old);
my $after_switch = 0;
my $until = time + 1;
while (time < $until)
{
	my $d = $s->consume('sen.cap', 'tenant_cap');
	$during++ if $d->{allowed} eq 't' && $d->{source} eq 'redis';
	$after_switch++ if $s->consume('sen.load', 'probe')->{source} eq 'redis';
	usleep(10_000);
}
cmp_ok($after_switch, '>', 10, "$after_switch decisions by Redis in the second after the switch");
is(script_calls($old), $old_calls,
	'none of them on the old master, which the sentinels no longer name (it is not demoted yet)');
my ($took, $sources) = until_redis_on('sen.load', $new->port, 20);
ok(defined $took, 'SENTINEL FAILOVER: decisions are made by Redis on the new master');
my $back_after = time - $failover_at;
note sprintf('SENTINEL FAILOVER: decided by Redis on the new master %.2f s after the failover began',
	$back_after);
cmp_ok($back_after, '<', 10, sprintf('within 10 s (%.2f s)', $back_after));
load_finish($load, 'SENTINEL FAILOVER');

# What the failover granted beyond sen.cap's capacity: what the old master took,
# while the sentinels still named it, that the new one never received. Redis
# replicates asynchronously; that is what Redis itself loses in a failover.
$cap_grants = take_all_cap($cap_grants + $during);
my $beyond = $cap_grants - 100;
note "SENTINEL FAILOVER: sen.cap (capacity 100) granted $cap_grants in all: "
  . ($beyond > 0 ? $beyond : 0) . ' beyond its capacity, taken on the old master before the switch';
cmp_ok($cap_grants, '>=', 100, 'sen.cap: at least its capacity was granted');
cmp_ok($beyond, '<', 100, 'sen.cap: less than one capacity beyond it');

# The old master is demoted, and in sync with the new; nothing runs there any more.
$deadline = time + 30;
usleep(100_000) until $old->cli('INFO', 'replication') =~ /role:slave.*master_link_status:up/s
  || time > $deadline;
like($old->cli('INFO', 'replication'), qr/role:slave.*master_link_status:up/s,
	'the old master is a replica in sync now');
$old_calls = script_calls($old);
$s->consume('sen.load', 'probe') for 1 .. 20;
is(script_calls($old), $old_calls, 'no decision goes to the old master');

###
### kill -9 of the master under load; the old master comes back empty.
###

($old, $new) = ($new, $old);
$load = load_start(10);
usleep(1_000_000);
my $killed_at = time;
$old->kill9;
($took, $sources) = until_redis_on('sen.load', $new->port, 30);
ok(defined $took, 'kill -9 of the master: decisions come back to Redis on the new master');
$back_after = time - $killed_at;
note sprintf('kill -9: decided by Redis on the new master %.2f s after the kill; meanwhile %s',
	$back_after, join(', ', map { "$_: $sources->{$_}" } sort keys %$sources));
cmp_ok($back_after, '<', 15, sprintf('within 15 s (%.2f s)', $back_after));
ok(!grep({ $_ ne 'redis' && $_ ne 'fail_closed' } keys %$sources),
	'meanwhile the closed fail mode decided, and nothing else');

# rl_health and rl_stats tell the outage.
my $stats = $node->safe_psql('postgres',
	"SELECT redis_errors FROM rl_stats WHERE policy = 'sen.load'");
like($stats, qr/"(connect|sentinel|connection lost|timeout)"/,
	"rl_stats counted the failures of the outage ($stats)");
load_finish($load, 'kill -9');

# The old master comes back empty, a master of its own until the sentinels demote it.
$old->start;
my $old_start = time;
my $restarted_calls = script_calls($old);
my $decided = 0;
while (time - $old_start < 3)
{
	$decided++ if $s->consume('sen.load', 'probe')->{source} eq 'redis';
	usleep(20_000);
}
cmp_ok($decided, '>', 20, "$decided decisions by Redis while the old master is back");
is(script_calls($old), $restarted_calls, 'none of them on the old master, back empty');
is(named_master(), $new->port, 'the sentinels still name the new master');

###
### A node that is not the master: what Sentinel names is checked with ROLE.
###

# A URL naming a replica directly: writes are refused (READONLY), the fail mode
# decides, the breaker opens, and rl_health says what and since when.
$deadline = time + 30;
usleep(100_000) until $old->cli('ROLE') =~ /^slave/ || time > $deadline;
my $r = session($node);
$r->query_ok('SET ratelimit.redis_url = '
	  . quote_literal($old->url(userinfo => "ratelimit:$user_pw")));
$d = $r->consume('sen.load', 'replica');
is_deeply([ @$d{qw(allowed source stderr)} ], [ 'f', 'fail_closed', '' ],
	'redis:// to a replica: the fail mode decides');
$h = health($r);
like($h->{last_error}, qr/^readonly: READONLY/, "rl_health().last_error says READONLY ($h->{last_error})");
is($h->{breaker}, 'open', 'and the breaker is open: a replica serves no one');
isnt($h->{last_error_at}, '', 'with the time it was seen');
$r->quit;

$s->quit;
$_->stop for @sentinels;
$master->stop;
$replica->stop;
done_testing();
