
# A private redis-server for the ratelimit TAP tests: started as the current user
# on 127.0.0.1 and a free port (and a unix socket), no persistence, optionally
# with a password or ACL users; stopped, killed, paused, resumed or restarted on
# the same port by the test, spoken to with redis-cli (cli, scan_keys,
# command_calls). Its process is registered with RateLimitTest::Children, so it
# is killed at END if the test has not stopped it.

package RateLimitTest::Redis;

use strict;
use warnings;

use POSIX ();
use Time::HiRes qw(time usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

use RateLimitTest::Children ();
use RateLimitTest::RespClient;

# Starts redis-server as the current user on 127.0.0.1 and a free port, with a
# unix socket too, no persistence. Options: name, password (requirepass),
# args (more redis-server arguments), acl (ACL SETUSER argument lists, applied
# at every start; then the "default" user is switched off and redis-cli logs in
# as the first of them, which must be an administrator), tls (a
# RateLimitTest::Certs: the port speaks TLS only, with tls_cert (default
# "server") and tls_auth_clients (default "no"); redis-cli then goes through
# the unix socket).
sub new
{
	my ($class, %opt) = @_;
	my $self = bless {
		name => $opt{name} // 'redis',
		password => $opt{password},
		args => $opt{args} // [],
		acl => $opt{acl},
		tls => $opt{tls},
		tls_cert => $opt{tls_cert} // 'server',
		tls_auth_clients => $opt{tls_auth_clients} // 'no',
		port => PostgreSQL::Test::Cluster::get_free_port(),
		dir => PostgreSQL::Test::Utils::tempdir(),
	}, $class;
	# A unix socket path has at most 107 bytes.
	$self->{dir} = PostgreSQL::Test::Utils::tempdir_short()
	  if length($self->{dir}) > 90;
	$self->{socket} = "$self->{dir}/redis.sock";
	$self->{logfile} =
	  "$PostgreSQL::Test::Utils::log_path/redis_$self->{name}_$self->{port}.log";
	$self->start;
	return $self;
}

sub port { return $_[0]->{port} }
sub socket_path { return $_[0]->{socket} }
sub pid { return $_[0]->{pid} }

# redis://[userinfo@]127.0.0.1:port[/db] (rediss:// with TLS; host: another name)
sub url
{
	my ($self, %opt) = @_;
	my $userinfo = defined $opt{userinfo} ? "$opt{userinfo}\@" : '';
	my $db = defined $opt{db} ? "/$opt{db}" : '';
	my $scheme = $self->{tls} ? 'rediss' : 'redis';
	my $host = $opt{host} // '127.0.0.1';
	return "$scheme://$userinfo$host:$self->{port}$db";
}

# unix://[userinfo@]/path/to/socket[?db=N]
sub unix_url
{
	my ($self, %opt) = @_;
	my $userinfo = defined $opt{userinfo} ? "$opt{userinfo}\@" : '';
	my $db = defined $opt{db} ? "?db=$opt{db}" : '';
	return "unix://$userinfo$self->{socket}$db";
}

# Starts (or starts again, on the same port) the server and waits until it answers.
sub start
{
	my ($self) = @_;
	die "redis-server $self->{name} is already running" if $self->{pid};
	unlink $self->{socket};
	my @tls = !$self->{tls} ? () : (
		'--tls-port' => $self->{port},
		'--tls-cert-file' => $self->{tls}->file("$self->{tls_cert}.crt"),
		'--tls-key-file' => $self->{tls}->file("$self->{tls_cert}.key"),
		'--tls-ca-cert-file' => $self->{tls}->file('ca.crt'),
		'--tls-auth-clients' => $self->{tls_auth_clients});
	my @cmd = (
		'redis-server',
		'--port' => $self->{tls} ? 0 : $self->{port},
		@tls,
		'--bind' => '127.0.0.1',
		'--unixsocket' => $self->{socket},
		'--unixsocketperm' => '700',
		'--dir' => $self->{dir},
		'--save' => '',
		'--appendonly' => 'no',
		'--daemonize' => 'no',
		'--logfile' => $self->{logfile},
		(defined $self->{password} ? ('--requirepass' => $self->{password}) : ()),
		@{ $self->{args} });
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		open(STDIN, '<', '/dev/null');
		open(STDOUT, '>>', $self->{logfile});
		open(STDERR, '>&', \*STDOUT);
		exec(@cmd) or POSIX::_exit(127);
	}
	RateLimitTest::Children::register_child($pid);
	$self->{pid} = $pid;

	my $deadline = time + 15;
	while (1)
	{
		my $pong = eval { local $self->{cli_user}; $self->cli('PING') } // '';
		# A server loading its dataset answers LOADING to everything: it is up.
		last if $pong eq 'PONG' || $pong =~ /^LOADING/;
		if (waitpid($pid, POSIX::WNOHANG()) == $pid || time > $deadline)
		{
			$self->_reap('KILL');
			die "redis-server $self->{name} did not start; see $self->{logfile}";
		}
		usleep(20_000);
	}
	if ($self->{acl})
	{
		delete $self->{cli_user};
		$self->cli('ACL', 'SETUSER', @$_) foreach @{ $self->{acl} };
		my ($user) = @{ $self->{acl}[0] };
		my ($password) = map { substr($_, 1) } grep { /^>/ } @{ $self->{acl}[0] };
		$self->{cli_user} = [ $user, $password ];
		$self->cli('ACL', 'SETUSER', 'default', 'off');
	}
	return $self;
}

# Forgets the process after killing it with signal (if still there).
sub _reap
{
	my ($self, $signal) = @_;
	my $pid = $self->{pid} or return;
	if ($signal)
	{
		kill 'CONT', $pid;
		kill $signal, $pid;
	}
	my $deadline = time + 10;
	while (waitpid($pid, POSIX::WNOHANG()) == 0)
	{
		if (time > $deadline)
		{
			kill 'KILL', $pid;
			waitpid($pid, 0);
			last;
		}
		usleep(10_000);
	}
	RateLimitTest::Children::forget_child($pid);
	delete $self->{pid};
}

# Stops the server cleanly (SIGTERM).
sub stop { $_[0]->_reap('TERM'); }

# Kills the server (SIGKILL): no goodbye to its clients.
sub kill9 { $_[0]->_reap('KILL'); }

# Freezes (SIGSTOP) and thaws (SIGCONT) the server: connections stay open, nothing answers.
sub pause { kill 'STOP', $_[0]->{pid}; }
sub resume { kill 'CONT', $_[0]->{pid}; }

# Kills it and starts it again on the same port, with an empty dataset.
sub restart
{
	my ($self) = @_;
	$self->kill9 if $self->{pid};
	return $self->start;
}

# Runs redis-cli against the server; returns its output, chomped (dies on failure).
# The first arguments may be redis-cli options (-n 3, --scan, ...).
sub cli
{
	my ($self, @args) = @_;
	my @cmd = $self->{tls} ? ('redis-cli', '-s', $self->{socket}) :
	  ('redis-cli', '-h', '127.0.0.1', '-p', $self->{port});
	if ($self->{cli_user})
	{
		push @cmd, '--user', $self->{cli_user}[0], '--pass', $self->{cli_user}[1],
		  '--no-auth-warning';
	}
	elsif (defined $self->{password})
	{
		push @cmd, '-a', $self->{password}, '--no-auth-warning';
	}
	my ($status, $out, $err) = RateLimitTest::Children::run_with_timeout([ @cmd, @args ], 20);
	die "redis-cli @args failed: $err" if $status != 0;
	chomp $out;
	return $out;
}

# A RESP connection to the server (RateLimitTest::RespClient): typed replies, pipelines.
# The default user's password only, and no TLS.
sub client
{
	my ($self) = @_;
	die 'RateLimitTest::Redis::client speaks plain TCP only' if $self->{tls} || $self->{cli_user};
	return RateLimitTest::RespClient->new(port => $self->{port}, password => $self->{password});
}

# Every key of database db (default 0), sorted.
sub scan_keys
{
	my ($self, $db) = @_;
	my $out = $self->cli('-n', $db // 0, '--scan');
	return sort grep { $_ ne '' } split /\n/, $out;
}

# The calls counted by INFO commandstats for a command (0 when never called).
sub command_calls
{
	my ($self, $command) = @_;
	my $info = $self->cli('INFO', 'commandstats');
	return $info =~ /^cmdstat_\Q$command\E:calls=(\d+)/m ? $1 : 0;
}

1;
