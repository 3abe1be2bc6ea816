
# Failing well under load, against a real redis-server: killed (SIGKILL) and
# frozen (SIGSTOP) while pgbench drives 16 sessions, the circuit breaker's
# one probe per retry_interval, 32 sessions racing for a local bucket of 100
# tokens while Redis is down, and a backend's memory across a million
# decisions with Redis flapping. Figures worth quoting are printed with note
# (prove -v, or the regress log).

use strict;
use warnings;

use List::Util qw(max min sum);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $retry_ms = 200;
my $command_timeout_ms = 300;
my $redis = redis_start(name => 'fail_well');
my $node = rl_node(
	'fail_well',
	redis => $redis,
	max_connections => 60,
	conf => [
		"ratelimit.retry_interval = '${retry_ms}ms'",
		"ratelimit.command_timeout = '${command_timeout_ms}ms'",
		# On loopback a connect takes microseconds; this also bounds how long
		# a probe can hold the breaker.
		"ratelimit.connect_timeout = '200ms'",
	]);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, local_share) VALUES
	  ('fw_open', 1000000000, 1000000, '1 second', 'open', 1),
	  ('fw_local', 1000000000, 1000000, '1 second', 'local', 1),
	  ('fw_closed', 1000000000, 1000000, '1 second', 'closed', 1),
	  ('fw_race', 100, 1, '1 day', 'local', 1),
	  ('fw_share', 100, 1, '1 day', 'local', 0.25);
	CREATE ROLE rl_mon LOGIN;
	GRANT pg_monitor TO rl_mon;
	CREATE UNLOGGED TABLE decisions (policy text, source text, allowed boolean, at timestamptz);
	CREATE UNLOGGED TABLE race (source text, allowed boolean);
	CREATE UNLOGGED TABLE timings (pid int, started timestamptz, ms float8, source text,
	                               retry_after_ms bigint);
	-- Decisions of policy p for secs seconds, each timed, 10 ms apart.
	CREATE PROCEDURE spin(p text, secs float8) LANGUAGE plpgsql AS $$
	DECLARE
	    stop timestamptz := clock_timestamp() + secs * interval '1 second';
	    t0 timestamptz;
	    d rl_decision;
	BEGIN
	    WHILE clock_timestamp() < stop LOOP
	        t0 := clock_timestamp();
	        d := rl_consume(p, 'spin_subject');
	        INSERT INTO timings VALUES (pg_backend_pid(), t0,
	            extract(epoch FROM clock_timestamp() - t0) * 1000, d.source, d.retry_after_ms);
	        PERFORM pg_sleep(0.01);
	    END LOOP;
	END
	$$;
	-- Decisions for secs seconds (at least min_n), half open, half local, over 500
	-- subjects; returns "decisions|by redis".
	CREATE FUNCTION churn(secs float8, min_n bigint) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE
	    stop timestamptz := clock_timestamp() + secs * interval '1 second';
	    n bigint := 0;
	    by_redis bigint := 0;
	    d rl_decision;
	BEGIN
	    LOOP
	        FOR i IN 1..1000 LOOP
	            d := rl_consume(CASE WHEN i % 2 = 0 THEN 'fw_local' ELSE 'fw_open' END,
	                            'churn_' || (i % 500));
	            IF d.source = 'redis' THEN
	                by_redis := by_redis + 1;
	            ELSIF d.source NOT IN ('local', 'fail_open') OR NOT d.allowed THEN
	                RAISE EXCEPTION 'unexpected decision %', d;
	            END IF;
	        END LOOP;
	        n := n + 1000;
	        EXIT WHEN clock_timestamp() >= stop AND n >= min_n;
	    END LOOP;
	    RETURN n || '|' || by_redis;
	END
	$$;
});

my $dir = PostgreSQL::Test::Utils::tempdir();
my $mon = session($node, user => 'rl_mon');

# Starts pgbench on script (text) with options (a list); returns a handle for
# pgbench_finish.
my $scripts = 0;
sub pgbench_start
{
	my ($script, @options) = @_;
	my $file = "$dir/script_" . ++$scripts . '.sql';
	append_to_file($file, $script);
	my $run = { out => '', err => '' };
	$run->{handle} = IPC::Run::start(
		[
			'pgbench', '-n',
			'-h' => $node->host,
			'-p' => $node->port,
			@options,
			'-f' => $file,
			'postgres'
		],
		'<', \undef, '>', \$run->{out}, '2>', \$run->{err},
		IPC::Run::timeout(120));
	return $run;
}

# Waits for pgbench to end; checks that it succeeded with no failed
# transaction; returns its output.
sub pgbench_finish
{
	my ($run, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $ok = eval { $run->{handle}->finish };
	note "pgbench $name:\n$run->{out}\n$run->{err}";
	ok($ok, "pgbench $name exits 0");
	like($run->{out}, qr/^number of failed transactions: 0 \(/m,
		"pgbench $name: 0 failed transactions");
	unlike($run->{err}, qr/aborted|ERROR/, "pgbench $name: no client aborted, no error");
	return $run->{out};
}

# A wall-clock time as PostgreSQL timestamptz text.
sub pg_time
{
	my ($t) = @_;
	return "to_timestamp($t)";
}

###
### Redis killed (SIGKILL) under load, then started again on the same port.
###

my $in_use_before = health($mon)->{local_buckets_in_use};
my $bench = pgbench_start(
	q{INSERT INTO decisions
  SELECT v.p, d.source, d.allowed, clock_timestamp()
  FROM generate_series(1, 10) g, (VALUES ('fw_open'), ('fw_local')) v(p),
       LATERAL rl_consume(v.p, 'k' || (:client_id * 10 + g)) d;
},
	'-c' => 16, '-j' => 4, '-T' => 10);
usleep(2_500_000);
$redis->kill9;
my $killed = time;

# During the outage, as a pg_monitor member sees it.
my @samples;
usleep(300_000);
while (time < $killed + 2.8)
{
	push @samples, health($mon);
	usleep(100_000);
}
ok(!(grep { $_->{breaker} ne 'open' } @samples),
	'rl_health() during the outage: breaker open (' . scalar(@samples) . ' samples)')
  or diag explain \@samples;
ok( (grep { $_->{redis_reachable} eq 'f' && $_->{last_error} eq 'connect: Connection refused' }
	  @samples),
	'rl_health() during the outage: Redis not reachable, connection refused')
  or diag explain \@samples;
ok(!(grep { $_->{last_error} eq '' || $_->{since} eq '' } @samples),
	'rl_health() during the outage: always a last error and a since')
  or diag explain \@samples;
my @reachable_while_down = grep { $_->{redis_reachable} eq 't' } @samples;
note scalar(@reachable_while_down) . ' of ' . scalar(@samples)
  . ' samples said redis_reachable = t while the breaker was open';

my $restart_called = time;
$redis->start;
my $up = time;
pgbench_finish($bench, 'SIGKILL');

my %count;
foreach my $row (split /\n/,
	$node->safe_psql('postgres',
		'SELECT policy, source, allowed, count(*) FROM decisions GROUP BY 1, 2, 3'))
{
	my ($policy, $source, $allowed, $n) = split /\|/, $row;
	$count{$policy}{"$source/$allowed"} = $n;
}
note explain \%count;
my $total = sum(map { values %$_ } values %count);
note "decisions during the SIGKILL run: $total";
cmp_ok($total, '>=', 200_000, 'several hundred thousand decisions in all');
is_deeply([ sort grep { !/^(redis\/t|fail_open\/t)$/ } keys %{ $count{fw_open} } ],
	[], 'open policy: every decision by Redis or allowed by fail_open');
is_deeply([ sort grep { !/^(redis\/t|local\/t)$/ } keys %{ $count{fw_local} } ],
	[], 'local policy: every decision by Redis or the local bucket');
ok($count{fw_open}{'fail_open/t'} && $count{fw_local}{'local/t'},
	'both fail modes decided during the outage');
ok($count{fw_open}{'redis/t'} && $count{fw_local}{'redis/t'}, 'and Redis before and after it');

my ($first_redis) = $node->safe_psql('postgres',
	"SELECT extract(epoch FROM min(at)) FROM decisions WHERE source = 'redis' AND at > "
	  . pg_time($restart_called));
ok($first_redis ne '', 'decisions come from Redis again after the restart');
my $recovery = ($first_redis || 1e9) - $restart_called;
note sprintf(
	'recovery: first Redis decision %.3f s after the restart was started (Redis answered PING after %.3f s; retry_interval %d ms)',
	$recovery, $up - $restart_called, $retry_ms);
cmp_ok($recovery, '<', $retry_ms / 1000 + 1,
	'within retry_interval + 1 s of the restart');
my ($after_recovery) = $node->safe_psql('postgres',
	"SELECT count(*) FILTER (WHERE source <> 'redis') || '|' || count(*) FROM decisions WHERE at > "
	  . pg_time($restart_called + $recovery + 0.5));
note "decisions from 0.5 s after recovery: not by Redis|all = $after_recovery";

my $h = health($mon);
is_deeply([ @$h{qw(breaker redis_reachable retry_in_ms shared)} ],
	[ 'closed', 't', 0, 't' ], 'rl_health() after recovery: closed, reachable')
  or diag explain $h;
cmp_ok($h->{local_buckets_in_use}, '>', $in_use_before,
	"local_buckets_in_use grew with local decisions ($in_use_before -> $h->{local_buckets_in_use})");

###
### Redis frozen (SIGSTOP) under load: no transaction waits much longer than
### command_timeout.
###

$bench = pgbench_start(
	q{INSERT INTO decisions
  SELECT v.p, d.source, d.allowed, clock_timestamp()
  FROM generate_series(1, 10) g, (VALUES ('fw_open'), ('fw_local')) v(p),
       LATERAL rl_consume(v.p, 's' || (:client_id * 10 + g)) d;
},
	'-c' => 16, '-j' => 4, '-T' => 6, '-l', "--log-prefix=$dir/stop");
usleep(1_500_000);
$redis->pause;
my $paused = time;
usleep(3_000_000);
$redis->resume;
my $frozen = time - $paused;
note sprintf('Redis was frozen for %.3f s', $frozen);
pgbench_finish($bench, 'SIGSTOP');

my @latencies;
foreach my $file (glob "$dir/stop.*")
{
	open(my $fh, '<', $file) or die "could not open $file: $!";
	while (<$fh>)
	{
		# client_id transaction_no time script_no time_epoch time_us
		my @f = split;
		push @latencies, $f[2] / 1000 if @f >= 6 && $f[2] =~ /^\d+$/;
	}
	close $fh;
}
my $worst = max(@latencies) // 0;
my $waited = grep { $_ >= $command_timeout_ms * 0.9 } @latencies;
note sprintf(
	'SIGSTOP: %d transactions, worst latency %.1f ms (command_timeout %d ms), %d waited the whole deadline',
	scalar @latencies, $worst, $command_timeout_ms, $waited);
cmp_ok(scalar @latencies, '>', 1000, 'pgbench logged every transaction');
cmp_ok($worst, '<', $command_timeout_ms + 1000,
	'no transaction lasted longer than command_timeout + 1 s');
cmp_ok($worst, '>=', $command_timeout_ms * 0.9,
	'some waited for the frozen Redis until the deadline');
# The 16 requests under way when Redis froze wait out their deadline; after
# that, one probe per retry_interval + command_timeout (the breaker), not one
# timeout per session and decision.
my $probes_max = int($frozen / (($retry_ms + $command_timeout_ms) / 1000)) + 2;
cmp_ok($waited, '<=', 16 + $probes_max,
	"at most one timeout per session in flight plus one probe per interval (<= 16 + $probes_max)");

###
### The breaker: while Redis is frozen, one probe per retry_interval for the
### whole server; every other decision returns at once.
###

my $breaker_retry_ms = 2000;
my @spinners = map { session($node) } 1 .. 4;
my $tripper = session($node);
foreach my $s (@spinners, $tripper)
{
	$s->query_ok("SET ratelimit.retry_interval = '${breaker_retry_ms}ms'; "
		  . "SET ratelimit.command_timeout = '${command_timeout_ms}ms'");
	is($s->consume('fw_closed', 'spin_subject')->{source}, 'redis',
		'before the freeze, Redis decides (connection open)');
}
$redis->pause;
my ($trip_elapsed, $trip) = timed(sub { $tripper->consume('fw_closed', 'spin_subject') });
my $tripped = time;
is($trip->{source}, 'fail_closed', 'the first decision after the freeze: fail_closed');
cmp_ok($trip_elapsed, '>=', $command_timeout_ms / 1000, 'after waiting command_timeout');
$_->start_query("CALL spin('fw_closed', 5)") for @spinners;
$_->wait_result(20) for @spinners;
$redis->resume;

my @rows = map { [ split /\|/ ] } split /\n/,
  $node->safe_psql('postgres',
	'SELECT pid, extract(epoch FROM started), ms, source, retry_after_ms FROM timings ORDER BY started');
my @slow = grep { $_->[2] >= 250 } @rows;
my @fast = grep { $_->[2] < 100 } @rows;
note sprintf(
	'breaker: %d decisions in 5 s by 4 sessions, %d probes (%s), slowest other decision %.1f ms',
	scalar @rows, scalar @slow,
	join(', ', map { sprintf('+%.3f s: %.0f ms by %d', $_->[1] - $tripped, $_->[2], $_->[0]) } @slow),
	max(map { $_->[2] } @fast) // 0);
cmp_ok(scalar @rows, '>', 400, 'the sessions kept deciding');
is(scalar(@fast) + scalar(@slow), scalar @rows,
	'every decision either returned within 100 ms or was a probe of about command_timeout');
ok(!(grep { $_->[3] ne 'fail_closed' } @rows), 'all decided by the fail mode')
  or diag explain [ grep { $_->[3] ne 'fail_closed' } @rows ];
ok(!(grep { $_->[2] > $command_timeout_ms + 200 } @slow), 'no probe waited much longer than command_timeout')
  or diag explain \@slow;
# Trip at t, probes at t + 2 s and t + 4.3 s (each probe waits 0.3 s, then
# the breaker opens for another 2 s): two probes in 5 s, not one per session.
is(scalar @slow, 2, 'exactly two probes in 5 s with retry_interval 2 s (4 sessions)')
  or diag explain \@slow;
if (@slow)
{
	my $first_gap = $slow[0][1] - $tripped;
	ok($first_gap >= 1.95 && $first_gap < 2.3,
		sprintf('the first probe came retry_interval after the trip (%.3f s)', $first_gap));
}
for my $i (1 .. $#slow)
{
	my $gap = $slow[$i][1] - $slow[ $i - 1 ][1];
	ok($gap >= 2.25 && $gap < 2.6,
		sprintf('the next probe came command_timeout + retry_interval later (%.3f s)', $gap));
}
# A fail_closed decision's retry_after_ms is the time until the next probe, counted from
# when the decision answered (its start plus what it took: on a busy machine a call can be
# held up between its start and its look at the breaker).
my @off;
foreach my $row (@fast)
{
	my ($next) = grep { $_->[1] > $row->[1] } @slow;
	my ($previous) = grep { $_->[1] <= $row->[1] } reverse @slow;
	next unless $next;
	# While a probe is under way, the retry-after is the probe's own deadline: so for a
	# decision made during one, and for one that was still running when the next began
	# (another session may have claimed that probe before this one looked). A decision that
	# began in the same microsecond as a probe is one made during it.
	next if $previous && $row->[1] < $previous->[1] + $previous->[2] / 1000 + 0.01;
	next if $row->[1] + $row->[2] / 1000 >= $next->[1];
	push @off, [ abs($row->[1] + ($row->[2] + $row->[4]) / 1000 - $next->[1]), $row, $next ];
}
cmp_ok(scalar @off, '>', 100, 'decisions between probes');
my ($furthest) = sort { $b->[0] <=> $a->[0] } @off;
cmp_ok($furthest ? $furthest->[0] : 1e9, '<', 0.06,
	'their retry_after_ms is the time until the next probe (within 60 ms)')
  or diag explain { worst => $furthest, probes => \@slow };
$_->quit for @spinners, $tripper;

###
### Redis down: 32 sessions race for a local bucket of 100 tokens.
###

$redis->kill9;
$bench = pgbench_start(
	q{INSERT INTO race SELECT d.source, d.allowed FROM rl_consume('fw_race', 'race_subject') d;
},
	'-c' => 32, '-j' => 4, '-t' => 10);
pgbench_finish($bench, 'race');
is( $node->safe_psql(
		'postgres',
		"SELECT count(*) || '|' || count(*) FILTER (WHERE allowed) || '|' || count(*) FILTER (WHERE source = 'local') FROM race"
	),
	'320|100|320',
	'320 attempts by 32 sessions, all decided locally: exactly 100 grants');

# A denial by the local bucket is a quota denial: RL429, not RL503.
my $s = session($node);
my ($out, $err) = $s->query(decision_sql('fw_race', 'race_subject', 1, 'rl_enforce'));
is(sqlstate_of($err), 'RL429', 'rl_enforce denied by the local bucket: RL429');
like($err, qr/rate limit exceeded for policy "fw_race"/, 'rate limit exceeded');
($out, $err) = $s->query(decision_sql('fw_closed', 'race_subject', 1, 'rl_enforce'));
is(sqlstate_of($err), 'RL503', 'rl_enforce on a closed policy meanwhile: RL503');

# local_share 0.25: a local bucket of 25 tokens for a policy of 100.
my @share = map { $s->consume('fw_share', 'share_subject') } 1 .. 30;
is_deeply(
	[ map { "$_->{source}/$_->{allowed}/$_->{remaining}" } @share ],
	[
		(map { "local/t/$_" } reverse 0 .. 24),
		('local/f/0') x 5
	],
	'local_share 0.25: 25 of 100 tokens, counted down by the local bucket');
cmp_ok($share[-1]{retry_after_ms}, '>', 3_600_000,
	'and a denial says when the slower local refill gives the next token');
my $too_big = $s->consume('fw_share', 'share_big', 30);
is_deeply([ @$too_big{qw(source allowed stderr)} ], [ 'fail_closed', 'f', '' ],
	'a cost above the local capacity (30 > 25): fail_closed, no error')
  or diag explain $too_big;
my $closed = $s->consume('fw_closed', 'share_subject');
ok( $closed->{source} eq 'fail_closed'
	  && $closed->{retry_after_ms} > 0
	  && $closed->{retry_after_ms} <= 2000,
	"a closed policy meanwhile: fail_closed, retry_after_ms until the next probe ($closed->{retry_after_ms} ms)"
) or diag explain $closed;

###
### A backend's memory across a million decisions with Redis flapping.
###

$redis->start;
# A probe every few ms while Redis is down: the connect path runs thousands of times.
$s->query_ok("SET ratelimit.retry_interval = '5ms'");
my $pid = $s->pid;

sub rss_anon_kb
{
	open(my $fh, '<', "/proc/$pid/status") or return undef;
	local $/;
	my $status = <$fh>;
	return $status =~ /^RssAnon:\s+(\d+)\s+kB/m ? $1 : undef;
}

my ($decisions, $by_redis, $flaps) = (0, 0, 0);
my ($rss_first, $rss_last);
my $churn_start = time;
for my $batch (1 .. 5)
{
	$s->start_query('SELECT churn(3, 200000)');
	my $deadline = time + 60;
	until ($s->done || time > $deadline)
	{
		$redis->kill9;
		usleep(250_000);
		$redis->start;
		$flaps++;
		usleep(250_000);
	}
	my ($out, $err) = $s->wait_result(60);
	is($err, '', "batch $batch: no error");
	my ($n, $r) = split /\|/, $out;
	$decisions += $n // 0;
	$by_redis += $r // 0;
	$rss_first = rss_anon_kb() if $batch == 1;
}
$rss_last = rss_anon_kb();
note sprintf(
	'memory: %d decisions (%d by Redis) in %.1f s with %d kill/restart cycles; RssAnon %d kB after the first batch, %d kB at the end (%+d kB)',
	$decisions, $by_redis, time - $churn_start, $flaps, $rss_first, $rss_last,
	$rss_last - $rss_first);
cmp_ok($decisions, '>=', 1_000_000, 'a million decisions or more');
cmp_ok($by_redis, '>', 20_000, 'many of them by Redis, between the outages');
cmp_ok($flaps, '>=', 20, 'Redis went down and up again many times');
cmp_ok($rss_last - $rss_first, '<', 3 * 1024, 'RssAnon grew by less than 3 MB');
is($s->query_ok('SELECT pg_backend_pid()'), $pid, 'the same backend throughout');
$s->quit;
$mon->quit;

my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* exited with exit code [^0]/,
	'no backend crashed');
unlike($log, qr/TRAP:|PANIC:/, 'no assertion failure or panic');
unlike($log, qr/\bERROR:(?!.*(?:rate limit exceeded|rate limiter unavailable))/,
	'no ERROR in the server log but the rate limit ones');
$node->stop;
$redis->stop;
done_testing();
