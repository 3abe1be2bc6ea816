
# A private Redis Sentinel for the ratelimit TAP tests: redis-server --sentinel
# on 127.0.0.1 and a free port, watching one master. Options: name, master_port,
# master_name (default "mymaster"), quorum (default 2), down_after_ms (1000),
# failover_timeout_ms (10000), conf (more lines for its configuration file,
# such as ACL users or the data nodes' password). Stopped by the test, or killed at
# END.

package RateLimitTest::Sentinel;

use strict;
use warnings;

use POSIX ();
use Time::HiRes qw(time usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

use RateLimitTest::Children ();

sub new
{
	my ($class, %opt) = @_;
	my $self = bless {
		name => $opt{name} // 'sentinel',
		port => PostgreSQL::Test::Cluster::get_free_port(),
		master_name => $opt{master_name} // 'mymaster',
		dir => PostgreSQL::Test::Utils::tempdir(),
		cli_args => $opt{cli_args} // [],
	}, $class;
	$self->{logfile} =
	  "$PostgreSQL::Test::Utils::log_path/sentinel_$self->{name}_$self->{port}.log";
	# A sentinel rewrites its configuration file: it must be its own.
	$self->{conf} = "$self->{dir}/sentinel.conf";
	PostgreSQL::Test::Utils::append_to_file(
		$self->{conf}, join("\n",
			"port $self->{port}",
			"bind 127.0.0.1",
			"dir $self->{dir}",
			"logfile $self->{logfile}",
			"sentinel monitor $self->{master_name} 127.0.0.1 $opt{master_port} "
			  . ($opt{quorum} // 2),
			"sentinel down-after-milliseconds $self->{master_name} " . ($opt{down_after_ms} // 1000),
			"sentinel failover-timeout $self->{master_name} " . ($opt{failover_timeout_ms} // 10000),
			@{ $opt{conf} // [] }, ''));
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', $self->{logfile});
		open(STDERR, '>&', \*STDOUT);
		exec('redis-server', $self->{conf}, '--sentinel') or POSIX::_exit(127);
	}
	RateLimitTest::Children::register_child($pid);
	$self->{pid} = $pid;
	my $deadline = time + 15;
	until ((eval { $self->cli('PING') } // '') eq 'PONG')
	{
		die "sentinel $self->{name} did not start; see $self->{logfile}" if time > $deadline;
		usleep(20_000);
	}
	return $self;
}

sub port { return $_[0]->{port} }

# "127.0.0.1:port", for a redis-sentinel:// URL.
sub address { return "127.0.0.1:$_[0]->{port}" }

# Runs redis-cli against the sentinel; returns its output, chomped.
sub cli
{
	my ($self, @args) = @_;
	my ($status, $out, $err) = RateLimitTest::Children::run_with_timeout(
		[ 'redis-cli', '-h', '127.0.0.1', '-p', $self->{port}, @{ $self->{cli_args} }, @args ], 20);
	die "redis-cli (sentinel) @args failed: $err" if $status != 0;
	chomp $out;
	return $out;
}

# The port of the master this sentinel names now.
sub master_port
{
	my ($self) = @_;
	my @addr = split /\n/, $self->cli('SENTINEL', 'get-master-addr-by-name', $self->{master_name});
	return $addr[1];
}

sub stop
{
	my ($self) = @_;
	my $pid = delete $self->{pid} or return;
	kill 'TERM', $pid;
	waitpid($pid, 0);
	RateLimitTest::Children::forget_child($pid);
}

1;
