
# Replies that mean "wrong node" or "not now", from real redis-servers (a fake
# only for what no Redis sends): LOADING, MASTERDOWN, NOREPLICAS, BUSY, OOM, NOSCRIPT beyond
# the retries, and a Redis that drops every connection (READONLY is in
# 170_sentinel.pl, NOPERM in 130_hostile_redis.pl). Each goes to the fail mode, is
# classified in rl_health (what, since when) and counted in rl_stats; those that
# mean the node cannot serve anyone (LOADING, MASTERDOWN, NOREPLICAS, dropped connections)
# open the breaker, so a broken Redis costs one probe per retry_interval; BUSY,
# OOM and NOSCRIPT do not.

use strict;
use warnings;

use IPC::Run ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'replies', args => [ '--busy-reply-threshold', 100 ]);
my $node = rl_node(
	'replies',
	redis => $redis,
	conf => ["ratelimit.retry_interval = '1s'"]);
my @policies = qw(rp.busy rp.oom rp.noreplicas rp.masterdown rp.loading rp.noscript rp.drops);
$node->safe_psql('postgres',
	'INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES '
	  . join(', ', map { "('$_', 100, 1, '1 day', 'closed')" } @policies));

# A session of its own with url: its own breaker.
sub url_session
{
	my ($url) = @_;
	my $s = session($node);
	$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($url));
	return $s;
}

# Checks one refused decision of policy in session s: the fail mode, rl_health's
# class (what, since when) and breaker, and the count in rl_stats.
sub check_refused
{
	my ($s, $policy, $what, $error, $breaker, $stat) = @_;
	my $d = $s->consume($policy, 'tenant_1');
	is_deeply([ @$d{qw(allowed source stderr)} ], [ 'f', 'fail_closed', '' ],
		"$what: the fail mode decides, no error")
	  or diag explain $d;
	my $h = health($s);
	like($h->{last_error}, $error, "$what: rl_health().last_error says what ($h->{last_error})");
	isnt($h->{last_error_at}, '', "$what: and since when");
	is($h->{breaker}, $breaker, "$what: the breaker is $breaker");
	like(
		$node->safe_psql('postgres', "SELECT redis_errors FROM rl_stats WHERE policy = '$policy'"),
		qr/"$stat": [1-9]/, "$what: rl_stats counts it as \"$stat\"");
	return $d;
}

###
### BUSY: another client's script runs on and on.
###

my $busy = IPC::Run::start([ 'redis-cli', '-p', $redis->port, 'EVAL', 'while true do end', '0' ],
	'<', \undef, '>', \my $busy_out, '2>', \my $busy_err);
usleep(300_000);
my $s = url_session($redis->url);
check_refused($s, 'rp.busy', 'BUSY', qr/^busy: BUSY/, 'closed', 'busy');
$redis->cli('SCRIPT', 'KILL');
$busy->finish;
is($s->consume('rp.busy', 'tenant_1')->{source}, 'redis', 'BUSY: once the script is killed, Redis decides');
$s->quit;

###
### OOM: over maxmemory, the script's first write is refused and nothing is written.
###

$s = url_session($redis->url);
$redis->cli('CONFIG', 'SET', 'maxmemory', 1);
check_refused($s, 'rp.oom', 'OOM', qr/^oom: OOM/, 'closed', 'oom');
$redis->cli('CONFIG', 'SET', 'maxmemory', 0);
my $d = $s->consume('rp.oom', 'tenant_1');
is_deeply([ @$d{qw(source remaining)} ], [ 'redis', 99 ],
	'OOM: with memory again, Redis decides: the refused take took nothing');
$s->quit;

###
### NOREPLICAS: a master told to take writes only while a replica follows it
### (min-replicas-to-write), with none: it cannot serve, like a replica.
###

$s = url_session($redis->url);
$redis->cli('CONFIG', 'SET', 'min-replicas-to-write', 1);
check_refused($s, 'rp.noreplicas', 'NOREPLICAS', qr/^readonly: NOREPLICAS/, 'open', 'readonly');
$redis->cli('CONFIG', 'SET', 'min-replicas-to-write', 0);
$s->quit;

###
### MASTERDOWN: a replica that lost its master, told not to serve stale data.
###

my $master = redis_start(name => 'replies_master', args => [ '--repl-diskless-sync-delay', 0 ]);
my $replica = redis_start(
	name => 'replies_replica',
	args => [ '--replicaof', '127.0.0.1', $master->port, '--replica-serve-stale-data', 'no' ]);
my $deadline = time + 30;
usleep(50_000) until $replica->cli('INFO', 'replication') =~ /master_link_status:up/
  || time > $deadline;
$master->stop;
$s = url_session($replica->url);
check_refused($s, 'rp.masterdown', 'MASTERDOWN', qr/^masterdown: MASTERDOWN/, 'open', 'masterdown');
$s->quit;
$replica->stop;

###
### LOADING: a Redis that loads its dataset (slowly: key-load-delay).
###

my $loading = redis_start(name => 'replies_loading', args => [ '--enable-debug-command', 'yes' ]);
$loading->cli('DEBUG', 'POPULATE', 200_000);
$loading->cli('SAVE');
# Slowly (key-load-delay), answering clients often while it loads.
push @{ $loading->{args} }, '--key-load-delay', 20, '--loading-process-events-interval-bytes', 1024;
$loading->restart;
like($loading->cli('PING'), qr/^LOADING/, 'the restarted Redis is loading its dataset');
$s = url_session($loading->url);
check_refused($s, 'rp.loading', 'LOADING', qr/^loading: LOADING/, 'open', 'loading');
# Seen while it loads: the rest may load at full speed (slowly, it took 20 s more).
$loading->cli('CONFIG', 'SET', 'key-load-delay', 0);
$deadline = time + 60;
usleep(100_000) until $loading->cli('PING') eq 'PONG' || time > $deadline;
usleep(1_100_000);    # retry_interval
is($s->consume('rp.loading', 'tenant_1')->{source}, 'redis', 'LOADING: once loaded, Redis decides');
$s->quit;
$loading->stop;

###
### NOSCRIPT beyond the retries: what no Redis sends (EVAL never answers it).
###

my $fake = fake_redis_start(reply => "-NOSCRIPT No matching script\r\n");
$s = url_session($fake->url);
check_refused($s, 'rp.noscript', 'NOSCRIPT to EVAL too', qr/^noscript: NOSCRIPT/, 'closed', 'noscript');
$s->quit;
$fake->stop;

###
### A Redis that drops every connection: one probe per retry_interval, not a
### connection per decision.
###

my $record = PostgreSQL::Test::Utils::tempdir() . '/commands';
$fake = fake_redis_start(
	reply => sub {
		open(my $fh, '>>', $record) or die "cannot append to $record: $!";
		print $fh "$_[0]\n";
		close $fh;
		return undef;
	});
$s = url_session($fake->url);
check_refused($s, 'rp.drops', 'a dropped connection', qr/^connection lost: /, 'open',
	'connection lost');
my $refused = 0;
my $start = time;
for (1 .. 20)
{
	$refused++ if $s->consume('rp.drops', 'tenant_1')->{source} eq 'fail_closed';
}
my $spent = time - $start;
is($refused, 20, '20 more decisions: all by the fail mode');
my $connections = () = (-e $record ? slurp_file($record) : '') =~ /\n/g;
cmp_ok($spent, '<', 1, sprintf('in %.2f s, less than retry_interval', $spent));
is($connections, 1, 'the Redis saw one request in all: the breaker kept the others away');
$s->quit;
$fake->stop;

$redis->stop;
done_testing();
