
# A minimal RESP client for the ratelimit TAP tests: one TCP connection to a
# redis-server, typed replies (an error reply is a RateLimitTest::RespClient::Error,
# never mistaken for data; nil is undef) and pipelines (every command written at
# once, then every reply read), so that a test can send thousands of script calls
# in one round trip.

package RateLimitTest::RespClient;

use strict;
use warnings;

use IO::Socket::INET;

# An error reply.
package RateLimitTest::RespClient::Error
{
	sub new { my ($class, $msg) = @_; return bless { msg => $msg }, $class }
	sub msg { return $_[0]{msg} }
}

# Connects to 127.0.0.1:port (AUTH [user] password when a password is given).
sub new
{
	my ($class, %opt) = @_;
	my $sock = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $opt{port},
		Proto => 'tcp') or die "cannot connect to redis on port $opt{port}: $!";
	binmode $sock;
	my $self = bless { sock => $sock }, $class;
	if (defined $opt{password})
	{
		my $ok = $self->command('AUTH', (defined $opt{user} ? ($opt{user}) : ()), $opt{password});
		die 'AUTH failed: ' . $ok->msg if is_error($ok);
	}
	return $self;
}

# True for an error reply.
sub is_error { return ref $_[0] eq 'RateLimitTest::RespClient::Error' }

# A command as RESP: an array of bulk strings.
sub _encode
{
	my @args = @_;
	my $out = '*' . scalar(@args) . "\r\n";
	for my $a (@args)
	{
		die 'undefined argument' unless defined $a;
		$out .= '$' . length($a) . "\r\n" . $a . "\r\n";
	}
	return $out;
}

# Reads one reply off the connection.
sub _read
{
	my ($self) = @_;
	my $sock = $self->{sock};
	my $line = readline($sock);
	die 'connection to redis closed' unless defined $line;
	$line =~ s/\r\n\z// or die "malformed reply line: $line";
	my ($type, $rest) = (substr($line, 0, 1), substr($line, 1));
	return $rest if $type eq '+';
	return RateLimitTest::RespClient::Error->new($rest) if $type eq '-';
	return 0 + $rest if $type eq ':';
	if ($type eq '$')
	{
		return undef if $rest == -1;
		my $data = '';
		while (length($data) < $rest + 2)
		{
			my $n = read($sock, $data, $rest + 2 - length($data), length($data));
			die 'connection to redis closed' unless $n;
		}
		return substr($data, 0, $rest);
	}
	if ($type eq '*')
	{
		return undef if $rest == -1;
		return [ map { $self->_read } 1 .. $rest ];
	}
	die "unknown reply type: $line";
}

# pipeline([cmd, args...], ...): every command in one write, then every reply in order.
sub pipeline
{
	my ($self, @cmds) = @_;
	my $sock = $self->{sock};
	# In chunks, so that neither side's buffers fill while the other waits.
	my @replies;
	while (my @chunk = splice(@cmds, 0, 1000))
	{
		print {$sock} join('', map { _encode(@$_) } @chunk) or die "write to redis: $!";
		$sock->flush;
		push @replies, map { $self->_read } @chunk;
	}
	return @replies;
}

# One command: its reply.
sub command
{
	my ($self, @args) = @_;
	my ($reply) = $self->pipeline([@args]);
	return $reply;
}

sub close { close $_[0]->{sock}; }

1;
