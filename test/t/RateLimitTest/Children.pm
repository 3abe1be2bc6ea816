
# The processes a ratelimit TAP test starts, and the bookkeeping that ends them:
# child processes (redis-server, fake servers, proxies, anything a test forks)
# and psql sessions that stay open are registered here, forgotten when they are
# stopped, and whatever is still registered is killed at END, even when the test
# dies. Only the process that loaded this module kills anything: a forked child
# that ran END blocks would leave the test's own processes alone.
#
# Also: commands run to completion with a timeout (run_with_timeout).

package RateLimitTest::Children;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run ();

# END blocks run last defined first: these are loaded before the END block
# below so that it runs before theirs (processes and sessions are killed
# before the nodes are stopped and the temporary directories removed).
use Test::More ();
use PostgreSQL::Test::Cluster ();
use PostgreSQL::Test::Utils ();

our @EXPORT_OK = qw(
  register_child forget_child register_session forget_session run_with_timeout
);

# Processes (redis-server, fake servers) to kill at END, by pid.
my %children;
# psql sessions still open, killed at END.
my %sessions;
my $main_pid = $$;

END
{
	if ($$ == $main_pid)
	{
		local $?;
		foreach my $session (values %sessions)
		{
			eval { $session->{run}->kill_kill(grace => 1) };
		}
		foreach my $pid (keys %children)
		{
			kill 'CONT', $pid;
			kill 'KILL', $pid;
			waitpid($pid, 0);
		}
	}
}

# Kills process pid at END unless it is forgotten first.
sub register_child
{
	my ($pid) = @_;
	$children{$pid} = 1;
}

# Leaves process pid alone at END (it has been stopped and reaped).
sub forget_child
{
	my ($pid) = @_;
	delete $children{$pid};
}

# Kills session's psql (a RateLimitTest::Session) at END unless it is forgotten first.
sub register_session
{
	my ($session) = @_;
	$sessions{"$session"} = $session;
}

# Leaves session alone at END (it has quit).
sub forget_session
{
	my ($session) = @_;
	delete $sessions{"$session"};
}

# Runs a command with a timeout; returns (exit status, stdout, stderr).
sub run_with_timeout
{
	my ($cmd, $timeout) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout // 30));
	return ($? >> 8, $out, $err);
}

1;
