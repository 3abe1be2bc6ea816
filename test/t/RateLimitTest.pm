
# Helpers for the ratelimit TAP tests: private redis-server instances (and fake
# servers) on 127.0.0.1, PostgreSQL nodes with the extension preloaded, psql
# sessions that stay open, and decision parsing.
#
# Every process started here is killed at END, even when a test dies.
#
# This is the module every test uses; it exports the helpers, which live in
# one file per concern under RateLimitTest/:
#   Children.pm    the processes and sessions to kill at END; run_with_timeout
#   Node.pm        PostgreSQL nodes (rl_node) and what reads them: logs,
#                  backends, rl_health(), key_installation, run_pgbench
#   Decision.pm    decision SQL and parsing, consume, quote_literal, sqlstate_of
#   Session.pm     RateLimitTest::Session, a psql session that stays open
#   Redis.pm       RateLimitTest::Redis, a private redis-server
#   RespClient.pm  RateLimitTest::RespClient, a RESP connection: typed replies, pipelines
#   FakeRedis.pm   RateLimitTest::FakeRedis, a fake RESP server for hostile replies
#   DelayProxy.pm  RateLimitTest::DelayProxy, a TCP proxy that delays bytes
#   Certs.pm       RateLimitTest::Certs, certificates made with openssl for TLS
#   Sentinel.pm    RateLimitTest::Sentinel, a private Redis Sentinel

package RateLimitTest;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use IO::Select;
use IO::Socket::INET;
use IPC::Run ();
use POSIX ();
use Time::HiRes qw(time usleep);
use Test::More;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

use RateLimitTest::Children qw(run_with_timeout);
use RateLimitTest::Decision
  qw(quote_literal sqlstate_of decision_sql parse_decision consume);
use RateLimitTest::Node qw(
  rl_node log_offset log_since wait_for_log backend_gone backend_peak_kb
  health key_installation run_pgbench
);
use RateLimitTest::Session;
use RateLimitTest::Redis;
use RateLimitTest::FakeRedis;
use RateLimitTest::DelayProxy;
use RateLimitTest::Certs;
use RateLimitTest::Sentinel;

our @EXPORT = qw(
  redis_start fake_redis_start rl_node session
  decision_sql parse_decision consume quote_literal sqlstate_of
  log_offset log_since wait_for_log timed run_pgbench backend_gone health
  key_installation delay_proxy_start backend_peak_kb certs_make sentinel_start
);

# Tests call these by their full names (RateLimitTest::_register_child($pid)
# for a process of their own, RateLimitTest::run_with_timeout(...)).
*_register_child = \&RateLimitTest::Children::register_child;
*_forget_child = \&RateLimitTest::Children::forget_child;
*_forget_session = \&RateLimitTest::Children::forget_session;

# Seconds a block took, and its result: (seconds, result).
sub timed
{
	my ($code) = @_;
	my $start = time;
	my @result = $code->();
	return (time - $start, @result);
}

# Opens a psql session that stays open (see RateLimitTest::Session).
sub session
{
	my ($node, %opt) = @_;
	my $session = RateLimitTest::Session->new($node, %opt);
	RateLimitTest::Children::register_session($session);
	return $session;
}

# Starts a private redis-server; see RateLimitTest::Redis::new.
sub redis_start
{
	return RateLimitTest::Redis->new(@_);
}

# Starts a fake Redis; see RateLimitTest::FakeRedis::new.
sub fake_redis_start
{
	return RateLimitTest::FakeRedis->new(@_);
}

# Makes a set of certificates; see RateLimitTest::Certs::new.
sub certs_make
{
	return RateLimitTest::Certs->new(@_);
}

# Starts a private Redis Sentinel; see RateLimitTest::Sentinel::new.
sub sentinel_start
{
	return RateLimitTest::Sentinel->new(@_);
}

# Starts a TCP proxy that delays every byte; see RateLimitTest::DelayProxy::new.
sub delay_proxy_start
{
	return RateLimitTest::DelayProxy->new(@_);
}

1;
