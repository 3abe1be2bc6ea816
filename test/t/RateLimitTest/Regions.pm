
# Three regions on loopback for the ratelimit TAP tests and bench/regions: in each a Redis
# (append-only, fsync always, as a strict budget's Redis must be: docs/regions.md) and a
# PostgreSQL server; the far regions reach the home region's Redis through delay proxies
# (their round trips), their own directly. Every server has the same installation and the
# same policies, one per mode, fixed windows of one second:
#   rg.home   home region a, every decision in a's Redis
#   rg.split  home region a, each region's share and leases of a's rest
#   rg.ind    independent, each region alone
#   rg.wide   split, windows of an hour, region_base the whole capacity (bounded by the
#             extension to capacity / 2 with three regions)
# A load runs pgbench in every region at once: takes of a tenant hot in region b, of one
# asked in every region, of one that moves between the regions every 5 s, and of cold
# subjects, each recorded with its
# time, latency and outcome; report() reads them back and measures.

package RateLimitTest::Regions;

use strict;
use warnings;

use IPC::Run ();
use List::Util qw(max min sum);
use PostgreSQL::Test::Utils ();
use Time::HiRes qw(time sleep);

use RateLimitTest;

our @REGIONS = qw(a b c);
our %POLICY = (home => 'rg.home', split => 'rg.split', independent => 'rg.ind');

# Starts the regions. Options: rtt (ms, per far region: {b => 40, c => 80}),
# capacity (per window of each policy, default 20), region_base (default: NULL).
sub new
{
	my ($class, %opt) = @_;
	my $self = bless {
		rtt => $opt{rtt} // { b => 40, c => 80 },
		capacity => $opt{capacity} // 20,
		dir => PostgreSQL::Test::Utils::tempdir(),
	}, $class;
	foreach my $r (@REGIONS)
	{
		$self->{redis}{$r} = redis_start(name => "region_$r",
			args => [ '--appendonly', 'yes', '--appendfsync', 'always' ]);
	}
	# The far regions' way to the home region's Redis: one proxy each.
	foreach my $r (grep { $_ ne 'a' } @REGIONS)
	{
		$self->{proxy}{$r} = delay_proxy_start(
			target_port => $self->{redis}{a}->port,
			delay_ms => $self->{rtt}{$r} / 2,
			lifetime => 3600);
	}
	my $installation;
	foreach my $r (@REGIONS)
	{
		my $list = join(' ', map { "$_=" . ($_ eq $r ? $self->{redis}{$_}->url
			: $_ eq 'a' ? $self->{proxy}{$r}->url : $self->{redis}{$_}->url) } @REGIONS);
		my $node = rl_node("region_$r", redis => $self->{redis}{$r}, max_connections => 30,
			conf => [ "ratelimit.region = '$r'", "ratelimit.regions = '$list'",
				"ratelimit.command_timeout = '1s'" ]);
		$installation //= $node->safe_psql('postgres', 'SELECT last_value FROM rl_installation_seq');
		my $base = defined $opt{region_base} ? $opt{region_base} : 'NULL';
		$node->safe_psql('postgres', qq{
			SELECT setval('rl_installation_seq', $installation);
			INSERT INTO rl_policy (name, algorithm, capacity, refill_period, region_mode, home_region, region_base)
			VALUES ('rg.home', 'fixed_window', $self->{capacity}, '1 second', 'home', 'a', NULL),
			       ('rg.split', 'fixed_window', $self->{capacity}, '1 second', 'split', 'a', $base),
			       ('rg.ind', 'fixed_window', $self->{capacity}, '1 second', 'independent', NULL, NULL),
			       ('rg.wide', 'fixed_window', $self->{capacity}, '1 hour', 'split', 'a', $self->{capacity});
			CREATE TABLE seen (region text, policy text, kind text, at_ms bigint, latency_us bigint,
			                   allowed boolean, reset_after_ms bigint, source text);
		});
		$self->{node}{$r} = $node;
	}
	return $self;
}

sub node { return $_[0]->{node}{ $_[1] } }
sub redis { return $_[0]->{redis}{ $_[1] } }
sub capacity { return $_[0]->{capacity} }

# The SQL of one recorded take: policy's subject (an SQL expression) of kind, in region.
sub _take
{
	my ($region, $policy, $kind, $subject) = @_;
	return "INSERT INTO seen SELECT '$region', '$policy', '$kind', t.ms, "
	  . "((extract(epoch FROM clock_timestamp()) * 1000000)::bigint - t.us), d.allowed, d.reset_after_ms, d.source "
	  . "FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms, "
	  . "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS us) t, "
	  . "LATERAL rl_consume('$policy', $subject) d;\n";
}

# The pgbench script of region: every policy's hot tenant (region b only), the mover
# (in its 5 s turn), a cold subject.
sub _script
{
	my ($self, $region) = @_;
	my $index = { a => 0, b => 1, c => 2 }->{$region};
	my $file = "$self->{dir}/load_$region.sql";
	return $file if -e $file;
	my $sql = "\\set cold random(1, 100000)\n";
	foreach my $policy (sort values %POLICY)
	{
		$sql .= _take($region, $policy, 'hot', "'hot'") if $region eq 'b';
		$sql .= _take($region, $policy, 'all', "'all'");
		$sql .= _take($region, $policy, 'cold', "'cold' || :cold");
		(my $mover = _take($region, $policy, 'mover', "'mover'")) =~
		  s/LATERAL/(SELECT WHERE (extract(epoch FROM clock_timestamp())::bigint \/ 5) % 3 = $index) m, LATERAL/;
		$sql .= $mover;
	}
	PostgreSQL::Test::Utils::append_to_file($file, $sql);
	return $file;
}

# Starts pgbench in region for seconds with clients; returns its handle.
sub load_start
{
	my ($self, $region, $seconds, $clients) = @_;
	my $node = $self->{node}{$region};
	my $run = { out => '', err => '' };
	$run->{handle} = IPC::Run::start(
		[ 'pgbench', '-n', '-h' => $node->host, '-p' => $node->port, '-c' => $clients,
			'-T' => $seconds, '-f' => $self->_script($region), 'postgres' ],
		'<', \undef, '>', \$run->{out}, '2>', \$run->{err}, IPC::Run::timeout($seconds + 120));
	return $run;
}

# Runs the load in every region for seconds; during it, $during->() (a partition, a kill).
sub load
{
	my ($self, $seconds, $clients, $during) = @_;
	my %runs = map { $_ => $self->load_start($_, $seconds, $clients) } @REGIONS;
	$during->() if $during;
	my %ok;
	foreach my $r (@REGIONS)
	{
		$ok{$r} = eval { $runs{$r}{handle}->finish } ? 1 : 0;
	}
	return \%ok;
}

# Cuts region off the home region (its proxy stopped: nothing gets through) for seconds,
# then heals it (a new proxy on the same port). Returns [from_ms, to_ms].
sub partition
{
	my ($self, $region, $seconds) = @_;
	my $port = $self->{proxy}{$region}->port;
	my $from = int(time * 1000);
	$self->{proxy}{$region}->stop;
	sleep $seconds;
	my $to = int(time * 1000);
	$self->{proxy}{$region} = delay_proxy_start(target_port => $self->{redis}{a}->port,
		delay_ms => $self->{rtt}{$region} / 2, lifetime => 3600, port => $port);
	return [ $from, $to ];
}

# Every recorded take of every region: [region, policy, kind, at_ms, latency_us, allowed,
# reset_after_ms, source].
sub rows
{
	my ($self) = @_;
	my @rows;
	foreach my $r (@REGIONS)
	{
		my $out = $self->{node}{$r}->safe_psql('postgres',
			q{SELECT region, policy, kind, at_ms, latency_us, allowed::int, reset_after_ms, source FROM seen});
		push @rows, map { [ split /\|/ ] } grep { length } split /\n/, $out;
	}
	return \@rows;
}

# The grants of policy per window of the policy (the second each was counted in: its
# time plus reset_after, rounded to the window's end), for subject kind.
sub grants_per_second
{
	my ($rows, $policy, $kind) = @_;
	my %count;
	foreach my $row (@$rows)
	{
		next unless $row->[1] eq $policy && $row->[2] eq $kind && $row->[5];
		my $end = int(($row->[3] + $row->[6]) / 1000 + 0.5);
		$count{$end}++;
	}
	return \%count;
}

# Admitted ÷ limit over aligned windows of span seconds: the worst, and the windows seen.
sub worst_ratio
{
	my ($per_second, $capacity, $span) = @_;
	my %window;
	$window{ int($_ / $span) } += $per_second->{$_} foreach keys %$per_second;
	my @ratios = map { $window{$_} / ($capacity * $span) } keys %window;
	return (@ratios ? max(@ratios) : 0, scalar @ratios);
}

# The q-quantile (0..1) of a list.
sub quantile
{
	my ($q, @values) = @_;
	return 0 unless @values;
	@values = sort { $a <=> $b } @values;
	return $values[ min($#values, int($q * @values)) ];
}

# Latencies (ms) of policy's takes of kind in region, optionally within [from, to) ms.
sub latencies
{
	my ($rows, $policy, $kind, $region, $from, $to) = @_;
	return map { $_->[4] / 1000 } grep {
		$_->[1] eq $policy && $_->[2] eq $kind && $_->[0] eq $region
		  && (!defined $from || ($_->[3] >= $from && $_->[3] < $to))
	} @$rows;
}

# Takes of policy in region within [from, to) ms: (granted, asked, sources seen).
sub outcomes
{
	my ($rows, $policy, $region, $from, $to) = @_;
	my ($granted, $asked, %sources) = (0, 0);
	foreach my $row (@$rows)
	{
		next unless $row->[1] eq $policy && $row->[0] eq $region && $row->[3] >= $from && $row->[3] < $to;
		$asked++;
		$granted += $row->[5];
		$sources{ $row->[7] }++;
	}
	return ($granted, $asked, \%sources);
}

# Budget stranded: in the windows where the hot tenant was denied somewhere, what the
# policy allowed and nobody was granted, as a share of the limit.
sub stranded
{
	my ($rows, $policy, $capacity) = @_;
	my (%denied, %granted);
	foreach my $row (@$rows)
	{
		next unless $row->[1] eq $policy && $row->[2] eq 'hot';
		my $end = int(($row->[3] + $row->[6]) / 1000 + 0.5);
		if ($row->[5]) { $granted{$end}++ } else { $denied{$end} = 1 }
	}
	my @windows = grep { $denied{$_} } keys %granted;
	return 0 unless @windows;
	return sum(map { $capacity - min($capacity, $granted{$_}) } @windows) / ($capacity * @windows);
}

1;
