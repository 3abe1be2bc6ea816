
# TLS to Redis (rediss://), against real TLS-only redis-servers and
# certificates made with openssl: decisions from Redis with the chain and the
# name verified; a wrong CA, a wrong name, an expired certificate, plain
# redis:// to the TLS port and rediss:// to a plain one each go to the fail
# mode with their reason logged, and open the breaker; mutual TLS; a client
# key others may read is refused; a cancel during a handshake that never
# completes; a lowered verification, documented for tests.

use strict;
use warnings;

use IO::Socket::INET;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $certs = certs_make();
my $redis = redis_start(name => 'tls', tls => $certs);
my $expired = redis_start(name => 'tls_expired', tls => $certs, tls_cert => 'expired');
my $mutual = redis_start(name => 'tls_mutual', tls => $certs, tls_auth_clients => 'yes');
my $plain = redis_start(name => 'plain');

my $node = rl_node(
	'tls',
	url => $redis->url,
	conf => [
		"ratelimit.tls_ca_file = '" . $certs->file('ca.crt') . "'",
		"ratelimit.retry_interval = '200ms'",
	]);
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('tls.closed', 100, 1, '1 day', 'closed');
});

# A session of its own, with url (its own breaker) and settings (name => value).
sub tls_session
{
	my ($url, %settings) = @_;
	my $s = session($node);
	$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($url));
	$s->query_ok("SET ratelimit.$_ = " . quote_literal($settings{$_})) for sort keys %settings;
	return $s;
}

###
### Decisions over TLS: the chain against tls_ca_file, the name against the host.
###

my $s = session($node);
my $d = $s->consume('tls.closed', 'tenant_1');
is_deeply([ @$d{qw(allowed remaining source stderr)} ], [ 't', 99, 'redis', '' ],
	'rediss://127.0.0.1: decided by Redis (the certificate names the address)')
  or diag explain $d;
my $h = health($s);
is_deeply([ @$h{qw(redis_reachable breaker last_error node)} ],
	[ 't', 'closed', '', '127.0.0.1:' . $redis->port ],
	'rl_health: reachable, breaker closed, no error, the node')
  or diag explain $h;
is($s->consume('tls.closed', 'tenant_1')->{remaining}, 98, 'the next decision on the same connection');
is($redis->cli('INFO', 'stats') =~ /^total_connections_received:(\d+)/m ? $1 : -1,
	3, 'one TLS connection served both (the others are redis-cli on the socket)');
$s->quit;

my $by_name = tls_session($redis->url(host => 'localhost'));
is($by_name->consume('tls.closed', 'tenant_1')->{source},
	'redis', 'rediss://localhost: decided by Redis (the certificate names the host)');
$by_name->quit;

###
### What must not pass: each goes to the fail mode, logged with its reason,
### and opens the breaker.
###

my @refused = (
	[
		'a certificate another CA signed (ratelimit.tls_ca_file of another CA)',
		$redis->url, { tls_ca_file => $certs->file('other_ca.crt') },
		'tls: certificate verify failed: self-signed certificate in certificate chain'
	],
	[
		'the system trust store, which does not hold the test CA',
		$redis->url, { tls_ca_file => '' },
		'tls: certificate verify failed: self-signed certificate in certificate chain'
	],
	[
		'a name the certificate does not carry (ratelimit.tls_server_name)',
		$redis->url, { tls_server_name => 'redis.example.com' },
		'tls: certificate verify failed: hostname mismatch'
	],
	[
		'an expired certificate',
		$expired->url, {},
		'tls: certificate verify failed: certificate has expired'
	],
	[
		'plain redis:// to the TLS port',
		'redis://127.0.0.1:' . $redis->port, {},
		qr/connection lost: /
	],
	[
		'rediss:// to a plain port',
		'rediss://127.0.0.1:' . $plain->port, { connect_timeout => '300ms' },
		qr/(tls: |timeout: TLS handshake timeout)/
	],);
for my $case (@refused)
{
	my ($what, $url, $settings, $error) = @$case;
	my $t = tls_session($url, %$settings);
	my $offset = log_offset($node);
	$d = $t->consume('tls.closed', 'tenant_2');
	is_deeply([ @$d{qw(allowed source stderr)} ], [ 'f', 'fail_closed', '' ],
		"$what: the fail mode decides, no error")
	  or diag explain $d;
	$h = health($t);
	if (ref $error)
	{
		like($h->{last_error}, qr/^$error/, "$what: rl_health().last_error says why ($h->{last_error})");
	}
	else
	{
		is($h->{last_error}, $error, "$what: rl_health().last_error says why");
	}
	isnt($h->{last_error_at}, '', "$what: and since when");
	is($h->{breaker}, 'open', "$what: the breaker is open");
	my $pid = $t->pid;
	my $reason = ref $error ? $error : quotemeta($error);
	ok(wait_for_log($node, qr/\[$pid\].*LOG:  ratelimit: Redis cannot answer \($reason/, $offset),
		"$what: the log says why");
	$t->quit;
}

###
### Mutual TLS: the server asks for a client certificate.
###

my $t = tls_session($mutual->url);
is($t->consume('tls.closed', 'tenant_3')->{source}, 'fail_closed',
	'mutual TLS without a client certificate: refused, the fail mode decides');
like(health($t)->{last_error}, qr/^(tls|connection lost): /,
	'and rl_health says the connection failed (' . health($t)->{last_error} . ')');
$t->quit;

$t = tls_session(
	$mutual->url,
	tls_cert_file => $certs->file('client.crt'),
	tls_key_file => $certs->file('client.key'));
is($t->consume('tls.closed', 'tenant_3')->{source}, 'redis',
	'mutual TLS with the client certificate: decided by Redis');
$t->quit;

# A key others may read is a secret that is not one: refused, before OpenSSL sees it.
my $loose_key = PostgreSQL::Test::Utils::tempdir() . '/client.key';
PostgreSQL::Test::Utils::append_to_file($loose_key, slurp_file($certs->file('client.key')));
chmod 0644, $loose_key;
$t = tls_session(
	$mutual->url,
	tls_cert_file => $certs->file('client.crt'),
	tls_key_file => $loose_key);
is($t->consume('tls.closed', 'tenant_3')->{source}, 'fail_closed',
	'a client key others may read: the fail mode decides');
is(health($t)->{last_error}, 'configuration: ratelimit.tls_key_file: others may read it',
	'and rl_health says why, without the key');
$t->quit;

# The TLS settings are for superusers alone: they say whom to trust.
$node->safe_psql('postgres', 'CREATE ROLE tls_plain LOGIN');
my $role = session($node, user => 'tls_plain');
my ($out, $err) = $role->query("SET ratelimit.tls_verify = 'none'");
is(sqlstate_of($err), '42501', 'a plain role may not set ratelimit.tls_verify (42501)');
($out, $err) = $role->query('SHOW ratelimit.tls_ca_file');
is(sqlstate_of($err), '42501', 'nor read ratelimit.tls_ca_file');
$role->quit;

###
### Lowered verification, for tests: 'ca' skips the name, 'none' the chain too.
###

$t = tls_session($redis->url, tls_server_name => 'redis.example.com', tls_verify => 'ca');
is($t->consume('tls.closed', 'tenant_4')->{source}, 'redis',
	"tls_verify = 'ca': a name the certificate lacks passes, the chain is still checked");
$t->quit;
$t = tls_session($redis->url, tls_ca_file => $certs->file('other_ca.crt'), tls_verify => 'ca');
is($t->consume('tls.closed', 'tenant_4')->{source}, 'fail_closed',
	"tls_verify = 'ca': a chain of another CA is still refused");
$t->quit;
$t = tls_session($redis->url, tls_ca_file => $certs->file('other_ca.crt'), tls_verify => 'none');
is($t->consume('tls.closed', 'tenant_4')->{source}, 'redis',
	"tls_verify = 'none': nothing is checked");
$t->quit;

###
### A cancel during a handshake that never completes: a server that accepts
### the connection and never answers.
###

my $listener = IO::Socket::INET->new(
	LocalAddr => '127.0.0.1',
	LocalPort => 0,
	Listen => 4,
	ReuseAddr => 1) or die "could not listen: $!";
$t = tls_session('rediss://127.0.0.1:' . $listener->sockport,
	connect_timeout => '60s', command_timeout => '60s');
$t->start_query(decision_sql('tls.closed', 'tenant_5'));
usleep(300_000);
ok(!$t->done, 'the handshake waits for a server that says nothing');
my $cancelled_at = time;
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $t->pid . ')');
($out, $err) = $t->wait_result(10);
my $waited = time - $cancelled_at;
is(sqlstate_of($err), '57014', 'pg_cancel_backend ends it (57014)') or diag $err;
cmp_ok($waited, '<', 1, sprintf('within a second of the cancel (%.3f s)', $waited));
note sprintf('cancel during a TLS handshake: answered %.3f s after pg_cancel_backend', $waited);
is($t->query_ok('SELECT 1'), '1', 'the backend is still usable');
$t->quit;
close $listener;

###
### A reply cut short mid-record (a TLS record's first 10 bytes, then nothing): the
### stream waits on the socket for the rest, so the deadline holds.
###

my $cutter = delay_proxy_start(target_port => $redis->port, delay_ms => 0, cut_after_s => 1);
$t = tls_session('rediss://127.0.0.1:' . $cutter->port, command_timeout => '300ms');
is($t->consume('tls.closed', 'tenant_6')->{source}, 'redis', 'through the proxy: decided by Redis');
usleep(1_200_000);
$t->start_query(decision_sql('tls.closed', 'tenant_6'));
($out, $err) = $t->wait_result(10);
like($out // '', qr/fail_closed/, 'a record cut short: the fail mode, once command_timeout passed')
  or diag "out: " . ($out // 'none') . " err: " . ($err // '');
is(health($t)->{last_error}, 'timeout: no answer in time', 'counted as a timeout, not a busy wait');
$t->quit;
$cutter->stop;

$expired->stop;
$mutual->stop;
$plain->stop;
$redis->stop;
done_testing();
