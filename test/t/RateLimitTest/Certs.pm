
# Certificates for the TLS tests, made with openssl in a private directory: a CA
# and the server certificate it signs (for "localhost" and 127.0.0.1), an
# expired one, one signed by another CA, and a client certificate. Keys are
# mode 600, as the server's user alone may read them.

package RateLimitTest::Certs;

use strict;
use warnings;

use PostgreSQL::Test::Utils;

# Runs openssl with args; dies with its output when it fails.
sub _openssl
{
	my (@args) = @_;
	my ($status, $out, $err) = RateLimitTest::Children::run_with_timeout([ 'openssl', @args ], 60);
	die "openssl @args failed: $err$out" if $status != 0;
	return $out;
}

# Makes every certificate in a new directory; returns the object (see file and dir).
sub new
{
	my ($class) = @_;
	my $self = bless { dir => PostgreSQL::Test::Utils::tempdir() }, $class;
	my $d = $self->{dir};
	PostgreSQL::Test::Utils::append_to_file("$d/server.ext",
		"subjectAltName=DNS:localhost,IP:127.0.0.1\n");
	PostgreSQL::Test::Utils::append_to_file("$d/client.ext", "extendedKeyUsage=clientAuth\n");
	for my $ca (qw(ca other_ca))
	{
		_openssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$d/$ca.key",
			'-out', "$d/$ca.crt", '-days', '3650', '-subj', "/CN=ratelimit test $ca");
	}
	# name => [signing CA, days (-1: expired yesterday), extensions]
	my %certs = (
		server => [ 'ca', 365, 'server.ext' ],
		expired => [ 'ca', -1, 'server.ext' ],
		stranger => [ 'other_ca', 365, 'server.ext' ],
		client => [ 'ca', 365, 'client.ext' ]);
	for my $name (sort keys %certs)
	{
		my ($ca, $days, $ext) = @{ $certs{$name} };
		_openssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', "$d/$name.key",
			'-out', "$d/$name.csr", '-subj', $name eq 'client' ? '/CN=ratelimit' : '/CN=localhost');
		_openssl('x509', '-req', '-in', "$d/$name.csr", '-CA', "$d/$ca.crt", '-CAkey',
			"$d/$ca.key", '-CAcreateserial', '-out', "$d/$name.crt", '-days', $days,
			'-extfile', "$d/$ext");
	}
	chmod 0600, glob("$d/*.key");
	chmod 0644, glob("$d/*.crt");
	return $self;
}

sub dir { return $_[0]->{dir} }

# The path of a file of the set: file('server.crt'), file('client.key'), ...
sub file { return "$_[0]->{dir}/$_[1]" }

1;
