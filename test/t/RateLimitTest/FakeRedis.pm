
# A fake Redis for the ratelimit TAP tests: a TCP server on 127.0.0.1, in a child
# process, that reads RESP commands and answers each with whatever bytes the
# test chooses (hostile replies: wrong types, huge or endless answers, closed
# connections). Its process is registered with RateLimitTest::Children, so it is
# killed at END if the test has not stopped it.

package RateLimitTest::FakeRedis;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time usleep);

use RateLimitTest::Children ();

# Starts, in a child process, a TCP server on 127.0.0.1 that reads RESP
# commands and answers each with reply->(command name in upper case, its arguments) (a
# string of raw bytes, or undef to close the connection). reply may also be a
# plain string, sent for every command, and an answer may be a hash
# { head => bytes, stream => bytes }: head, then stream again and again until
# the client goes. The child gives up after lifetime s.
sub new
{
	my ($class, %opt) = @_;
	my $reply = $opt{reply} // "+OK\r\n";
	$reply = do { my $r = $reply; sub { $r } } unless ref $reply;
	my $listener = IO::Socket::INET->new(
		LocalAddr => '127.0.0.1',
		LocalPort => 0,
		Listen => 16,
		ReuseAddr => 1) or die "could not listen: $!";
	my $self = bless { port => $listener->sockport }, $class;
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		# Never run the parent's END blocks (they stop nodes and servers).
		eval { _serve($listener, $reply, $opt{lifetime} // 120) };
		POSIX::_exit(0);
	}
	close $listener;
	RateLimitTest::Children::register_child($pid);
	$self->{pid} = $pid;
	return $self;
}

sub port { return $_[0]->{port} }

sub url { return "redis://127.0.0.1:$_[0]->{port}" }

sub stop
{
	my ($self) = @_;
	return unless $self->{pid};
	kill 'KILL', $self->{pid};
	waitpid($self->{pid}, 0);
	RateLimitTest::Children::forget_child($self->{pid});
	delete $self->{pid};
}

# Takes one RESP command (an array of bulk strings) off the front of buffer.
sub _take_command
{
	my ($buffer) = @_;
	return undef unless $$buffer =~ /\A\*(\d+)\r\n/;
	my $count = $1;
	my $pos = length("*$count\r\n");
	my @args;
	for (1 .. $count)
	{
		my $header = substr($$buffer, $pos);
		return undef unless $header =~ /\A\$(\d+)\r\n/;
		my $length = $1;
		$pos += length("\$$length\r\n");
		return undef if length($$buffer) < $pos + $length + 2;
		push @args, substr($$buffer, $pos, $length);
		$pos += $length + 2;
	}
	substr($$buffer, 0, $pos) = '';
	return \@args;
}

sub _serve
{
	my ($listener, $reply, $lifetime) = @_;
	my $deadline = time + $lifetime;
	my $select = IO::Select->new($listener);
	my %buffers;
	while (time < $deadline)
	{
		foreach my $socket ($select->can_read(0.2))
		{
			if ($socket == $listener)
			{
				my $client = $listener->accept or next;
				$select->add($client);
				$buffers{$client} = '';
				next;
			}
			my $read = sysread($socket, my $chunk, 65536);
			if (!$read)
			{
				$select->remove($socket);
				delete $buffers{$socket};
				close $socket;
				next;
			}
			$buffers{$socket} .= $chunk;
			while (my $command = _take_command(\$buffers{$socket}))
			{
				my $answer = $reply->(uc($command->[0] // q{}), @$command[1 .. $#$command]);
				if (!defined $answer)
				{
					$select->remove($socket);
					delete $buffers{$socket};
					close $socket;
					last;
				}
				if (ref $answer eq 'HASH')
				{
					# A reply that never ends: write until the client is gone.
					local $SIG{PIPE} = 'IGNORE';
					syswrite($socket, $answer->{head}) if defined $answer->{head};
					my $chunk = $answer->{stream} x 4096;
					while (time < $deadline)
					{
						last unless defined syswrite($socket, $chunk);
					}
					$select->remove($socket);
					delete $buffers{$socket};
					close $socket;
					last;
				}
				syswrite($socket, $answer);
			}
		}
	}
}

1;
