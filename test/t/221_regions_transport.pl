#!/usr/bin/perl
#
# Regions over every transport: a server whose own Redis is a plain one calls policies
# homed in three other regions, one behind TLS, one a Redis Cluster, one found through
# Sentinel. Each region's Redis keeps its own connections, cluster map, Sentinel link and
# breaker: decisions alternating between all four land in the right Redis (a cluster's
# spread over its masters), on connections opened once; a reservation rolled back gives
# back to the region it was taken in; the regions' URLs carry their own passwords, and
# this server's password file is never sent to them.

use strict;
use warnings;

use List::Util qw(sum);
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;
use RateLimitTest::Cluster;

my $certs = certs_make();
my $own = redis_start(name => 'own', password => 'own-secret');
my $tls = redis_start(name => 'far_tls', tls => $certs, password => 'tls-secret');
my $cluster = RateLimitTest::Cluster->new(name => 'c221');
my $master = redis_start(name => 'far_master');
my $sentinel = sentinel_start(name => 's221', master_port => $master->port, quorum => 1);

my $dir = PostgreSQL::Test::Utils::tempdir();
my $password_file = "$dir/redis.password";
append_to_file($password_file, "own-secret\n");
chmod 0600, $password_file;

my $regions = join(' ',
	'here=' . $own->url,
	'tl=' . $tls->url(userinfo => ':tls-secret'),
	'cl=' . $cluster->seeds_url,
	'se=redis-sentinel://' . $sentinel->address . '/mymaster');
my $node = rl_node('regions_transport', url => $own->url,
	conf => [
		"ratelimit.redis_password_file = '$password_file'",
		"ratelimit.tls_ca_file = '" . $certs->file('ca.crt') . "'",
		"ratelimit.region = 'here'",
		"ratelimit.regions = '$regions'",
	]);
$node->safe_psql('postgres', q{
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period, region_mode, home_region) VALUES
	  ('t.own', 'fixed_window', 1000, '1 hour', NULL, NULL),
	  ('t.tls', 'fixed_window', 1000, '1 hour', 'home', 'tl'),
	  ('t.cluster', 'fixed_window', 1000, '1 hour', 'home', 'cl'),
	  ('t.sentinel', 'fixed_window', 1000, '1 hour', 'home', 'se');
});

my %server = (own => $own, tls => $tls, sentinel => $master);
my %connections_before = map { $_ => $server{$_}->cli('INFO', 'stats') =~ /total_connections_received:(\d+)/ ? $1 : 0 } keys %server;

# One session, 50 rounds, each round a decision in each of the four Redis servers.
my $granted = $node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE d.allowed) || '/' || count(*)
	FROM generate_series(1, 50) g, unnest(ARRAY['t.own', 't.tls', 't.cluster', 't.sentinel']) p,
	     LATERAL rl_consume(p, 'subject' || g) d});
is($granted, '200/200', 'decisions alternating between four Redis servers: all granted');
# (Read before anything else here connects: this INFO's own connection is one of them.)
my %connections_after = map { $_ => $server{$_}->cli('INFO', 'stats') =~ /total_connections_received:(\d+)/ ? $1 : 0 } keys %server;

foreach my $where ([ 'own', 't.own' ], [ 'tls', 't.tls' ], [ 'sentinel', 't.sentinel' ])
{
	my ($name, $policy) = @$where;
	my @keys = grep { /\Q$policy\E/ } $server{$name}->scan_keys('*');
	is(scalar @keys, 50, "$policy: its 50 subjects counted in the $name Redis");
	my @elsewhere = grep { $_ ne $name && grep { /\Q$policy\E/ } $server{$_}->scan_keys('*') } keys %server;
	is("@elsewhere", '', "$policy: in no other Redis");
	my $opened = $connections_after{$name} - $connections_before{$name} - 1;
	cmp_ok($opened, '<=', 1, "$policy: the $name Redis was connected to once, not once per switch ($opened)");
}
my @per_master = map {
	my $m = $_;
	scalar grep { /t\.cluster/ } $m->scan_keys('*')
} $cluster->masters;
is(sum(@per_master), 50, 't.cluster: its 50 subjects counted in the cluster');
cmp_ok(scalar(grep { $_ > 0 } @per_master), '>=', 2, "t.cluster: spread over the masters (@per_master)");

# A reservation rolled back gives back in the Redis it was taken in.
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT rl_reserve('t.tls', 'reserved', 7);
	SELECT rl_reserve('t.cluster', 'reserved', 5);
	SELECT rl_reserve('t.own', 'reserved', 3);
	ROLLBACK;});
is($node->safe_psql('postgres', q{
	SELECT string_agg(p || '=' || (rl_peek(p, 'reserved')).remaining, ',' ORDER BY p)
	FROM unnest(ARRAY['t.cluster', 't.own', 't.tls']) p}),
	't.cluster=1000,t.own=1000,t.tls=1000', 'a rollback gives back in each region\'s Redis');

# A reload that drops a region while a transaction holds a lease taken there: the end of the
# transaction still gives back everything else it owes (the reservation in this server's
# Redis); the lease, whose Redis is no longer known, is left to its TTL.
{
	$node->safe_psql('postgres', q{
		INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, region_mode, home_region)
		VALUES ('t.lease', 'concurrency', 5, '1 hour', 'home', 'tl')});
	my $s = session($node);
	$s->query_ok('BEGIN');
	is($s->query(q{SELECT allowed FROM rl_acquire('t.lease', 'worker')}), 't', 'a lease taken in the TLS region');
	is($s->query(q{SELECT allowed FROM rl_reserve('t.own', 'dropped', 9)}), 't', 'and a reservation here');
	my $without_tl = join(' ', grep { !/^tl=/ } split / /, $regions);
	$node->safe_psql('postgres', "ALTER SYSTEM SET ratelimit.regions = '$without_tl'; SELECT pg_reload_conf();");
	sleep 1;
	my ($out, $err) = $s->query('ROLLBACK');
	unlike($err // '', qr/ERROR/, 'the rollback ends without an error');
	is($node->safe_psql('postgres', q{SELECT remaining FROM rl_peek('t.own', 'dropped')}), '1000',
		'the reservation in this server\'s Redis is given back all the same');
	$s->quit;
	$node->safe_psql('postgres', "ALTER SYSTEM RESET ratelimit.regions; SELECT pg_reload_conf();");
}

# This server's password (its file) was never offered to a region: the TLS region's
# Redis saw only its own password (a wrong one would be an AUTH error in its stats).
like($tls->cli('INFO', 'errorstats'), qr/^(?!.*WRONGPASS)/s, 'the TLS region never saw a wrong password');
is($master->cli('INFO', 'errorstats') =~ /NOAUTH|WRONGPASS/ ? 'auth errors' : 'none', 'none',
	'the Sentinel region (no password) was never sent this server\'s');

done_testing();
