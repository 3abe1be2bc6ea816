
# Helpers for the ratelimit TAP tests: private redis-server instances (and fake
# servers) on 127.0.0.1, PostgreSQL nodes with the extension preloaded, psql
# sessions that stay open, and decision parsing.
#
# Every process started here is killed at END, even when a test dies.

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

our @EXPORT = qw(
  redis_start fake_redis_start rl_node session
  decision_sql parse_decision consume quote_literal sqlstate_of
  log_offset log_since wait_for_log timed run_pgbench backend_gone health
  key_installation delay_proxy_start backend_peak_kb
);

# Processes (redis-server, fake servers) to kill at END, by pid.
my %children;
# psql sessions still open, killed at END.
my %sessions;
my $main_pid = $$;

# Cluster::init runs "$PG_REGRESS --config-auth" (a no-op on Unix): find the installed
# pg_regress when the caller did not say where it is.
if (!$ENV{PG_REGRESS} || $ENV{PG_REGRESS} eq '/bin/false' || !-x $ENV{PG_REGRESS})
{
	my $pgxs = `pg_config --pgxs 2>/dev/null`;
	chomp $pgxs;
	my $pg_regress = dirname(dirname($pgxs)) . '/test/regress/pg_regress';
	$ENV{PG_REGRESS} = -x $pg_regress ? $pg_regress : '/bin/true';
}

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

# Runs a command with a timeout; returns (exit status, stdout, stderr).
sub run_with_timeout
{
	my ($cmd, $timeout) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout // 30));
	return ($? >> 8, $out, $err);
}

# The SQL literal for a string.
sub quote_literal
{
	my ($text) = @_;
	$text =~ s/'/''/g;
	return "'$text'";
}

# The SQLSTATE of the first error in psql's (VERBOSITY=verbose) stderr, or ''.
sub sqlstate_of
{
	my ($stderr) = @_;
	return ($stderr // '') =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5}):/ ? $1 : '';
}

# SELECT of every field of one decision.
sub decision_sql
{
	my ($policy, $subject, $cost, $function) = @_;
	return sprintf(
		'SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source FROM %s(%s, %s, %d)',
		$function // 'rl_consume',
		quote_literal($policy), quote_literal($subject), $cost // 1);
}

# A hash of the fields of one decision row printed by psql -At, or undef.
sub parse_decision
{
	my ($line) = @_;
	return undef unless defined $line;
	chomp $line;
	my @fields = split /\|/, $line, -1;
	return undef unless @fields == 8;
	my %decision;
	@decision{qw(allowed remaining capacity retry_after_ms reset_after_ms policy version source)} =
	  @fields;
	return \%decision;
}

# One decision in a new session of node (dies on an SQL error).
sub consume
{
	my ($node, $policy, $subject, $cost, %opt) = @_;
	my $sql = decision_sql($policy, $subject, $cost);
	$sql = "$opt{setup}; $sql" if $opt{setup};
	return parse_decision(
		$node->safe_psql($opt{db} // 'postgres', $sql, timeout => 60));
}

# Seconds a block took, and its result: (seconds, result).
sub timed
{
	my ($code) = @_;
	my $start = time;
	my @result = $code->();
	return (time - $start, @result);
}

# Waits until node has no backend pid (true), or 10 s (false).
sub backend_gone
{
	my ($node, $pid) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid");
}

# What follows v<version> in the keys of node's database db: '' for an installation
# upgraded from 0.3.0, else '.' and the installation's id in base 36.
sub key_installation
{
	my ($node, $db) = @_;
	my $id = $node->safe_psql($db // 'postgres', 'SELECT last_value FROM rl_installation_seq');
	return '' if $id == 0;
	my $digits = '';
	while ($id > 0)
	{
		$digits = substr('0123456789abcdefghijklmnopqrstuvwxyz', $id % 36, 1) . $digits;
		$id = int($id / 36);
	}
	return ".$digits";
}

# rl_health() in session s, as a hash by column name.
sub health
{
	my ($s) = @_;
	my @fields = qw(redis_reachable since breaker retry_in_ms last_error
	  local_buckets_in_use local_buckets shared);
	my @values = split /\|/, $s->query_ok('SELECT * FROM rl_health()'), -1;
	my %health;
	@health{@fields} = @values;
	return \%health;
}

# Runs pgbench on node: clients sessions, each running the script file transactions
# times; checks that it exits 0 and that every transaction ran.
sub run_pgbench
{
	my ($node, $name, $file, $clients, $transactions) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run(
		[
			'pgbench', '-n',
			'-h' => $node->host,
			'-p' => $node->port,
			'-c' => $clients,
			'-j' => 4,
			'-t' => $transactions,
			'-f' => $file,
			'postgres'
		],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(180));
	note "pgbench $name:\n$out\n$err";
	ok($ok, "pgbench $name exits 0");
	my $expected = $clients * $transactions;
	like(
		$out,
		qr/number of transactions actually processed: $expected\/$expected/,
		"pgbench $name: all $expected transactions ran");
	return $out;
}

# The size of node's log, to read what comes after it.
sub log_offset
{
	my ($node) = @_;
	return -s $node->logfile // 0;
}

# What node's log got after offset.
sub log_since
{
	my ($node, $offset) = @_;
	return slurp_file($node->logfile, $offset);
}

# Waits (at most timeout seconds) until node's log after offset matches regex.
sub wait_for_log
{
	my ($node, $regex, $offset, $timeout) = @_;
	my $deadline = time + ($timeout // 10);
	while (1)
	{
		my $log = log_since($node, $offset);
		return 1 if $log =~ $regex;
		return 0 if time > $deadline;
		usleep(50_000);
	}
}

# Creates and starts a node with ratelimit preloaded and created in "postgres".
# Options: redis (a RateLimitTest::Redis) or url, max_connections, conf (lines),
# preload (default 1; 0: the library is loaded by CREATE EXTENSION only),
# create_extension (default 1; 0: the caller creates it), allows_streaming (for
# a standby made from a backup of it).
sub rl_node
{
	my ($name, %opt) = @_;
	my $url = $opt{url} // ($opt{redis} ? $opt{redis}->url : '');
	my $preload = $opt{preload} // 1;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(allows_streaming => $opt{allows_streaming} // 0);
	$node->append_conf(
		'postgresql.conf', join("\n",
			($preload ? "shared_preload_libraries = 'ratelimit'" : ()),
			"max_connections = " . ($opt{max_connections} // 20),
			"ratelimit.redis_url = '$url'",
			# Statements would put subjects in the log; the tests check that
			# the extension never does.
			"log_statement = none",
			@{ $opt{conf} // [] }));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION ratelimit')
	  if $opt{create_extension} // 1;
	return $node;
}

# Opens a psql session that stays open (see RateLimitTest::Session).
sub session
{
	my ($node, %opt) = @_;
	my $session = RateLimitTest::Session->new($node, %opt);
	$sessions{"$session"} = $session;
	return $session;
}

sub _forget_session
{
	my ($session) = @_;
	delete $sessions{"$session"};
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

# Starts a TCP proxy that delays every byte; see RateLimitTest::DelayProxy::new.
sub delay_proxy_start
{
	return RateLimitTest::DelayProxy->new(@_);
}

# The peak resident memory (VmHWM, kB) of process pid so far, from /proc.
sub backend_peak_kb
{
	my ($pid) = @_;
	my $status = slurp_file("/proc/$pid/status");
	return $status =~ /^VmHWM:\s+(\d+) kB/m ? $1 : undef;
}

sub _register_child
{
	my ($pid) = @_;
	$children{$pid} = 1;
}

sub _forget_child
{
	my ($pid) = @_;
	delete $children{$pid};
}


package RateLimitTest::Redis;

use strict;
use warnings;

use POSIX ();
use Time::HiRes qw(time usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

# Starts redis-server as the current user on 127.0.0.1 and a free port, with a
# unix socket too, no persistence. Options: name, password (requirepass),
# args (more redis-server arguments), acl (ACL SETUSER argument lists, applied
# at every start; then the "default" user is switched off and redis-cli logs in
# as the first of them, which must be an administrator).
sub new
{
	my ($class, %opt) = @_;
	my $self = bless {
		name => $opt{name} // 'redis',
		password => $opt{password},
		args => $opt{args} // [],
		acl => $opt{acl},
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

# redis://[userinfo@]127.0.0.1:port[/db]
sub url
{
	my ($self, %opt) = @_;
	my $userinfo = defined $opt{userinfo} ? "$opt{userinfo}\@" : '';
	my $db = defined $opt{db} ? "/$opt{db}" : '';
	return "redis://${userinfo}127.0.0.1:$self->{port}$db";
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
	my @cmd = (
		'redis-server',
		'--port' => $self->{port},
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
	RateLimitTest::_register_child($pid);
	$self->{pid} = $pid;

	my $deadline = time + 15;
	while (1)
	{
		my $pong = eval { local $self->{cli_user}; $self->cli('PING') } // '';
		last if $pong eq 'PONG';
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
	RateLimitTest::_forget_child($pid);
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
	my @cmd = ('redis-cli', '-h', '127.0.0.1', '-p', $self->{port});
	if ($self->{cli_user})
	{
		push @cmd, '--user', $self->{cli_user}[0], '--pass', $self->{cli_user}[1],
		  '--no-auth-warning';
	}
	elsif (defined $self->{password})
	{
		push @cmd, '-a', $self->{password}, '--no-auth-warning';
	}
	my ($status, $out, $err) = RateLimitTest::run_with_timeout([ @cmd, @args ], 20);
	die "redis-cli @args failed: $err" if $status != 0;
	chomp $out;
	return $out;
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


package RateLimitTest::FakeRedis;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time usleep);

# Starts, in a child process, a TCP server on 127.0.0.1 that reads RESP
# commands and answers each with reply->(command name in upper case) (a
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
	RateLimitTest::_register_child($pid);
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
	RateLimitTest::_forget_child($self->{pid});
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
				my $answer = $reply->(uc($command->[0] // ''));
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


package RateLimitTest::DelayProxy;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes qw(time);

# Starts, in a child process, a TCP proxy on 127.0.0.1 to target_port that holds
# every byte for delay_ms in each direction, as a Redis that far away would
# (a round trip of twice delay_ms). Options: target_port, delay_ms, lifetime (s).
sub new
{
	my ($class, %opt) = @_;
	my $listener = IO::Socket::INET->new(
		LocalAddr => '127.0.0.1',
		LocalPort => 0,
		Listen => 64,
		ReuseAddr => 1) or die "could not listen: $!";
	my $self = bless { port => $listener->sockport }, $class;
	my $pid = fork();
	die "fork failed: $!" unless defined $pid;
	if ($pid == 0)
	{
		eval { _relay($listener, $opt{target_port}, ($opt{delay_ms} // 10) / 1000, $opt{lifetime} // 300) };
		POSIX::_exit(0);
	}
	close $listener;
	RateLimitTest::_register_child($pid);
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
	RateLimitTest::_forget_child($self->{pid});
	delete $self->{pid};
}

sub _relay
{
	my ($listener, $target_port, $delay, $lifetime) = @_;
	local $SIG{PIPE} = 'IGNORE';
	my $deadline = time + $lifetime;
	my $select = IO::Select->new($listener);
	my %peer;     # socket => the socket its bytes go to
	my @queue;    # [due time, socket to write to, bytes], in order
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


package RateLimitTest::Session;

use strict;
use warnings;

use IPC::Run ();
use Time::HiRes qw(time usleep);

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
	  $self->query(RateLimitTest::decision_sql($policy, $subject, $cost));
	my $decision = RateLimitTest::parse_decision($out) // { output => $out };
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
	RateLimitTest::_forget_session($self);
	return;
}

1;
