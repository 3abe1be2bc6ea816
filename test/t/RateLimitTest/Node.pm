
# PostgreSQL nodes for the ratelimit TAP tests: rl_node makes and starts one
# with the extension preloaded and created, and the rest reads what a node
# says: its log (log_offset, log_since, wait_for_log), its backends
# (backend_gone, backend_peak_kb), rl_health() (health), the installation id in
# its keys (key_installation), and pgbench run against it (run_pgbench).
#
# Loading it points PG_REGRESS at the installed pg_regress when the caller did
# not say where it is.

package RateLimitTest::Node;

use strict;
use warnings;

use Digest::MD5 ();
use Exporter 'import';
use File::Basename qw(dirname);
use IPC::Run ();
use Time::HiRes qw(time usleep);
use Test::More;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

our @EXPORT_OK = qw(
  rl_node log_offset log_since wait_for_log backend_gone backend_peak_kb
  health key_installation run_pgbench
);

# Cluster::init runs "$PG_REGRESS --config-auth" (a no-op on Unix): find the installed
# pg_regress when the caller did not say where it is.
if (!$ENV{PG_REGRESS} || $ENV{PG_REGRESS} eq '/bin/false' || !-x $ENV{PG_REGRESS})
{
	my $pgxs = `pg_config --pgxs 2>/dev/null`;
	chomp $pgxs;
	my $pg_regress = dirname(dirname($pgxs)) . '/test/regress/pg_regress';
	$ENV{PG_REGRESS} = -x $pg_regress ? $pg_regress : '/bin/true';
}

# initdb takes one to two seconds on a busy machine, for every node of every test: it
# runs once per tmp_check (and initdb binary and arguments), its data directory is kept
# as a template, and every other node copies that (the same files, the same system
# identifier, which nothing here reads).
my $system_or_bail = \&PostgreSQL::Test::Utils::system_or_bail;

sub _initdb_from_template
{
	my ($initdb, $D, $pgdata, @args) = @_;
	die "unexpected initdb arguments: @_" unless $D eq '-D';
	my ($path) = grep { -x $_ } map { "$_/$initdb" } split /:/, ($ENV{PATH} // '');
	my $key = Digest::MD5::md5_hex(join("\0", $path // $initdb, (stat($path // '.'))[ 7, 9 ], @args));
	my $template = "$PostgreSQL::Test::Utils::tmp_check/initdb_template_$key";
	if (!-d $template)
	{
		$system_or_bail->($initdb, $D, $pgdata, @args);
		# Made aside and renamed into place: a template is complete or absent.
		my $tmp = "$template.tmp$$";
		$system_or_bail->('cp', '-RPp', $pgdata, $tmp);
		rename($tmp, $template) or $system_or_bail->('rm', '-rf', $tmp);
		return;
	}
	$system_or_bail->('cp', '-RPp', $template, $pgdata);
	return;
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
	{
		# Cluster::init runs initdb through this function: copy the template instead.
		no warnings 'redefine';
		local *PostgreSQL::Test::Utils::system_or_bail = sub {
			return _initdb_from_template(@_) if $_[0] eq 'initdb';
			return $system_or_bail->(@_);
		};
		$node->init(allows_streaming => $opt{allows_streaming} // 0);
	}
	$node->append_conf(
		'postgresql.conf', join("\n",
			($preload ? "shared_preload_libraries = 'ratelimit'" : ()),
			# dev/run-tests tap-shared: every test again through the shared connections.
			# A worker per Redis node and URL: the tests use many.
			($preload && $ENV{RL_REDIS_CONNECTIONS}
				? ("ratelimit.redis_connections = '$ENV{RL_REDIS_CONNECTIONS}'",
					'max_worker_processes = 48') : ()),
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

# Waits until node has no backend pid (true), or 10 s (false).
sub backend_gone
{
	my ($node, $pid) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $pid");
}

# The peak resident memory (VmHWM, kB) of process pid so far, from /proc.
sub backend_peak_kb
{
	my ($pid) = @_;
	my $status = slurp_file("/proc/$pid/status");
	return $status =~ /^VmHWM:\s+(\d+) kB/m ? $1 : undef;
}

# rl_health() in session s, as a hash by column name.
sub health
{
	my ($s) = @_;
	my @fields = qw(redis_reachable since breaker retry_in_ms last_error
	  local_buckets_in_use local_buckets shared last_error_at node);
	my @values = split /\|/, $s->query_ok('SELECT ' . join(', ', @fields) . ' FROM rl_health()'), -1;
	my %health;
	@health{@fields} = @values;
	return \%health;
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

1;
