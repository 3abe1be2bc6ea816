
# A TCP proxy for the ratelimit TAP tests: listens on 127.0.0.1, in a child
# process, and relays to a target port, holding every byte for a while in each
# direction, as a Redis far away would. Its process is registered with
# RateLimitTest::Children, so it is killed at END if the test has not stopped it.

package RateLimitTest::DelayProxy;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time);

use RateLimitTest::Children ();

# Starts, in a child process, a TCP proxy on 127.0.0.1 to target_port that holds
# every byte for delay_ms in each direction, as a Redis that far away would
# (a round trip of twice delay_ms). Options: target_port, delay_ms, lifetime (s), port
# (to listen on: another proxy's, stopped, to heal a partition; default a free one),
# cut_after_s: once a connection is that old, the next bytes from the target reach the
# client only in part (10 bytes: a TLS record cut short) and nothing more follows.
sub new
{
	my ($class, %opt) = @_;
	my $listener = IO::Socket::INET->new(
		LocalAddr => '127.0.0.1',
		LocalPort => $opt{port} // 0,
		Listen => 64,
		ReuseAddr => 1) or die "could not listen: $!";
	my $self = bless { port => $listener->sockport }, $class;
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		eval {
			_relay($listener, $opt{target_port}, ($opt{delay_ms} // 10) / 1000, $opt{lifetime} // 300,
				$opt{cut_after_s});
		};
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

sub _relay
{
	my ($listener, $target_port, $delay, $lifetime, $cut_after) = @_;
	local $SIG{PIPE} = 'IGNORE';
	my $deadline = time + $lifetime;
	my $select = IO::Select->new($listener);
	my %peer;     # socket => the socket its bytes go to
	my @queue;    # [due time, socket to write to, bytes], in order
	my %upstream_since;    # upstream socket => when its connection was accepted
	my %cut;               # upstream sockets whose replies were cut short
	my $close = sub {
		my ($socket) = @_;
		# A copy: deleting from %peer must not free what the loop walks.
		my @pair = grep { defined } ($socket, $peer{$socket});
		foreach my $s (@pair)
		{
			$select->remove($s);
			delete $peer{$s};
			close $s;
		}
	};
	while (time < $deadline)
	{
		my $wait = @queue ? $queue[0][0] - time : 0.2;
		$wait = 0 if $wait < 0;
		foreach my $socket ($select->can_read($wait))
		{
			if ($socket == $listener)
			{
				my $client = $listener->accept or next;
				my $upstream = IO::Socket::INET->new(
					PeerAddr => '127.0.0.1',
					PeerPort => $target_port) or do { close $client; next };
				$peer{$client} = $upstream;
				$peer{$upstream} = $client;
				$upstream_since{$upstream} = time;
				$select->add($client, $upstream);
				next;
			}
			my $read = sysread($socket, my $chunk, 65536);
			my $to = $peer{$socket};
			if (!$read)
			{
				push @queue, [ time + $delay, $to, undef ] if defined $to;
				$select->remove($socket);
				next;
			}
			if (defined $cut_after && exists $upstream_since{$socket}
				&& time - $upstream_since{$socket} >= $cut_after)
			{
				next if $cut{$socket}++;
				$chunk = substr($chunk, 0, 10);
			}
			push @queue, [ time + $delay, $to, $chunk ] if defined $to;
		}
		while (@queue && $queue[0][0] <= time)
		{
			my ($due, $to, $bytes) = @{ shift @queue };
			next unless defined $to && exists $peer{$to};
			if (!defined $bytes)
			{
				$close->($to);
				next;
			}
			$close->($to) unless defined syswrite($to, $bytes);
		}
	}
}

1;
