
# A psql session for the ratelimit TAP tests that stays open: one psql process on
# one connection, so queries run one after the other in the same backend, and a
# query can be sent now and its result waited for later. Sessions opened with
# RateLimitTest::session are registered with RateLimitTest::Children, so their
# psql is killed at END if the test has not quit them.

package RateLimitTest::Session;

use strict;
use warnings;

use IPC::Run ();
use Time::HiRes qw(time usleep);

use RateLimitTest::Children ();
use RateLimitTest::Decision ();

# A psql process on one connection that stays open: queries run one after the
# other in the same backend. Errors do not stop it; stderr shows SQLSTATEs.
# Options: db (default postgres), user, options (the startup packet's, as
# PGOPTIONS takes them), timeout (default for each query, s).
sub new
{
	my ($class, $node, %opt) = @_;
	my $connstr = $node->connstr($opt{db} // 'postgres');
	$connstr .= " user=$opt{user}" if defined $opt{user};
	$connstr .= " options='$opt{options}'" if defined $opt{options};
	my $self = bless {
		stdin => '',
		stdout => '',
		stderr => '',
		count => 0,
		timeout => $opt{timeout} // 60,
	}, $class;
	$self->{run} = IPC::Run::start(
		[
			'psql', '-X', '-A', '-t', '-q',
			'-v', 'ON_ERROR_STOP=0',
			'-v', 'VERBOSITY=verbose',
			'-d', $connstr, '-f', '-'
		],
		'<', \$self->{stdin},
		'>', \$self->{stdout},
		'2>', \$self->{stderr});
	$self->{pid} = $self->query_ok('SELECT pg_backend_pid()');
	return $self;
}

# The backend's process id.
sub pid { return $_[0]->{pid} }

# Sends sql without waiting for its result (see wait_result).
sub start_query
{
	my ($self, $sql) = @_;
	die "a query is already under way" if $self->{pending};
	my $n = ++$self->{count};
	$self->{pending} = $n;
	$self->{stdin} .= "$sql\n;\n\\echo RL_DONE_$n\n\\warn RL_DONE_$n\n";
	$self->{run}->pump_nb;
	return;
}

# True when the query sent has finished (without waiting).
sub done
{
	my ($self) = @_;
	my $n = $self->{pending};
	$self->{run}->pump_nb if $self->{run}->pumpable;
	return $self->{stdout} =~ /RL_DONE_$n\n/ && $self->{stderr} =~ /RL_DONE_$n\n/;
}

# Waits for the query sent to finish; returns its stdout (chomped), and in list
# context (stdout, stderr). Dies after timeout seconds.
sub wait_result
{
	my ($self, $timeout) = @_;
	my $n = $self->{pending} // die "no query under way";
	my $deadline = time + ($timeout // $self->{timeout});
	until ($self->done)
	{
		die "psql session ended: $self->{stderr}" unless $self->{run}->pumpable;
		die "query $n timed out after " . ($timeout // $self->{timeout}) . " s"
		  if time > $deadline;
		usleep(5_000);
	}
	$self->{stdout} =~ s/\A(.*?)RL_DONE_$n\n//s;
	my $out = $1;
	$self->{stderr} =~ s/\A(.*?)RL_DONE_$n\n//s;
	my $err = $1;
	chomp $out;
	delete $self->{pending};
	return wantarray ? ($out, $err) : $out;
}

# Runs sql and waits for it: stdout, or (stdout, stderr).
sub query
{
	my ($self, $sql, $timeout) = @_;
	$self->start_query($sql);
	return $self->wait_result($timeout);
}

# Like query, but dies when sql wrote anything on stderr.
sub query_ok
{
	my ($self, $sql, $timeout) = @_;
	my ($out, $err) = $self->query($sql, $timeout);
	die "query failed: $sql\n$err" if $err ne '';
	return $out;
}

# One decision in this session: a hash of its fields (empty when there is no
# decision row), with the session's stderr for it under "stderr".
sub consume
{
	my ($self, $policy, $subject, $cost) = @_;
	my ($out, $err) =
	  $self->query(RateLimitTest::Decision::decision_sql($policy, $subject, $cost));
	my $decision = RateLimitTest::Decision::parse_decision($out) // { output => $out };
	$decision->{stderr} = $err;
	return $decision;
}

# Ends psql (killing it if it does not end within 10 s).
sub quit
{
	my ($self) = @_;
	$self->{stdin} .= "\\q\n";
	eval {
		my $deadline = time + 10;
		while ($self->{run}->pumpable && time < $deadline)
		{
			$self->{run}->pump_nb;
			usleep(10_000);
		}
		$self->{run}->kill_kill(grace => 1) if $self->{run}->pumpable;
		$self->{run}->finish;
	};
	RateLimitTest::Children::forget_session($self);
	return;
}

1;
