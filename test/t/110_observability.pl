
# Observability against real servers: rl_stats counts what pgbench did, exactly;
# Redis stopped or frozen shows as fail-mode decisions and failure classes; a
# server without shared_preload_libraries has no rl_stats (55000) but decides;
# the decision log writes one well-formed line per chosen decision (sampled as
# asked) and never the subject; a backend waiting for Redis shows the wait event
# in pg_stat_activity; the queries of monitoring/postgres_exporter.yaml run as a
# pg_monitor role and give the metrics the file names; policies beyond
# ratelimit.stats_policies are counted together as "(other)".

use strict;
use warnings;

use File::Basename qw(dirname);
use IPC::Run ();
use JSON::PP ();
use List::Util qw(sum0);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $stats_policies = 16;
my $secret = 'tap-secret-110';
my $redis = redis_start(name => 'observability');
my $node = rl_node(
	'observability',
	redis => $redis,
	conf => [
		"ratelimit.retry_interval = '200ms'",
		"ratelimit.subject_secret = '$secret'",
		"ratelimit.stats_policies = $stats_policies",
	]);

# Subjects that must never reach a server log: an e-mail and a safe id.
my $email = 'alice.visible@example.com';
my $tenant = 'tenant_visible_42';

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('obs_bench', 500, 1, '1 day', 'closed'),
	  ('obs_log', 5, 5, '1 hour', 'closed'),
	  ('obs_sample', 1000000, 1000000, '1 second', 'closed'),
	  ('obs_open', 1000, 1000, '1 day', 'open'),
	  ('obs_closed', 1000, 1000, '1 day', 'closed'),
	  ('obs_timeout', 1000, 1000, '1 day', 'open'),
	  ('obs_wait', 1000, 1000, '1 day', 'closed'),
	  ('obs_hist', 1000, 1000, '1 day', 'closed');
	-- These count Redis calls and log lines per decision, denials included, which the
	-- deny cache (test/t/195_deny_cache.pl) would answer itself.
	UPDATE rl_policy SET deny_cache = false WHERE name IN ('obs_bench', 'obs_log');
});

my $json = JSON::PP->new;

# The rl_stats row of policy (a hash; jsonb columns decoded), or undef.
sub stats
{
	my ($policy, $on) = @_;
	my $row = ($on // $node)->safe_psql('postgres',
		'SELECT row_to_json(s) FROM rl_stats s WHERE policy = ' . quote_literal($policy));
	return $row eq '' ? undef : $json->decode($row);
}

# The round trips a latency_histogram holds.
sub round_trips
{
	my ($histogram) = @_;
	return sum0(map { $_->{count} } @$histogram);
}

# Checks that the latency columns of stats row s are known and ordered.
sub latency_ok
{
	my ($s, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	ok( defined $s->{latency_p50_ms}
		  && $s->{latency_p50_ms} > 0
		  && $s->{latency_p50_ms} <= $s->{latency_p99_ms}
		  && $s->{latency_p99_ms} <= $s->{latency_max_ms},
		"$name: 0 < p50 <= p99 <= max")
	  or diag explain $s;
}

# Checks that every counter of stats row s is zero, without latency.
sub all_zero
{
	my ($s, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my @counters = qw(decisions allowed denied tokens_granted shadow_denials source_redis
	  source_local source_fail_open source_fail_closed source_override source_disabled
	  redis_calls);
	is_deeply(
		{
			(map { $_ => $s->{$_} } @counters),
			redis_errors => $s->{redis_errors},
			latency_p50_ms => $s->{latency_p50_ms},
			latency_p99_ms => $s->{latency_p99_ms},
			latency_max_ms => $s->{latency_max_ms},
			latency_histogram => $s->{latency_histogram},
		},
		{
			(map { $_ => 0 } @counters),
			redis_errors => {},
			latency_p50_ms => undef,
			latency_p99_ms => undef,
			latency_max_ms => undef,
			latency_histogram => [],
		},
		$name);
}

###
### (a) rl_stats matches a pgbench run exactly.
###

my $dir = PostgreSQL::Test::Utils::tempdir();
my ($clients, $transactions) = (8, 100);
my $total = $clients * $transactions;
my $capacity = 500;    # obs_bench: 500 tokens, one more a day
my $bench_script = "$dir/bench.sql";
append_to_file($bench_script,
	"SELECT * FROM rl_consume('obs_bench', 'bench_subject');\n");

$node->safe_psql('postgres', 'SELECT rl_stats_reset()');
run_pgbench($node, 'obs_bench', $bench_script, $clients, $transactions);
my $s = stats('obs_bench');
is_deeply(
	{
		map { $_ => $s->{$_} }
		  qw(decisions allowed denied tokens_granted shadow_denials source_redis
		  source_local source_fail_open source_fail_closed source_override
		  source_disabled redis_calls redis_errors)
	},
	{
		decisions => $total,
		allowed => $capacity,
		denied => $total - $capacity,
		tokens_granted => $capacity,
		shadow_denials => 0,
		source_redis => $total,
		source_local => 0,
		source_fail_open => 0,
		source_fail_closed => 0,
		source_override => 0,
		source_disabled => 0,
		redis_calls => $total,
		redis_errors => {},
	},
	"pgbench: $total decisions, $capacity allowed, one Redis call each")
  or diag explain $s;
is(round_trips($s->{latency_histogram}), $s->{redis_calls},
	'pgbench: the histogram holds every round trip');
latency_ok($s, 'pgbench');
cmp_ok($s->{latency_max_ms}, '<',
	$s->{latency_histogram}[-1]{le_ms}, 'the slowest round trip is in the last bucket');

my $before_reset = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
$node->safe_psql('postgres', 'SELECT rl_stats_reset()');
$s = stats('obs_bench');
all_zero($s, 'rl_stats_reset: every counter of obs_bench back to zero, no latency');
is($node->safe_psql('postgres',
		"SELECT stats_reset > '$before_reset' FROM rl_stats WHERE policy = 'obs_bench'"),
	't', 'rl_stats_reset: stats_reset says when');
is($node->safe_psql('postgres', 'SELECT count(*) FROM rl_stats WHERE decisions > 0 OR redis_calls > 0'),
	'0', 'rl_stats_reset: no row of this database counts anything');

###
### (d) The decision log.
###

# The decision log lines of backend pid after offset: hashes of their fields.
sub decision_lines
{
	my ($on, $offset, $pid) = @_;
	my @lines;
	foreach my $line (split /\n/, log_since($on, $offset))
	{
		next unless $line =~ /ratelimit decision:/;
		next if defined $pid && $line !~ /\[$pid\]/;
		my %f = (line => $line);
		if ($line =~
			/ LOG:  ratelimit decision: policy=([a-z0-9_.-]+) version=(\d+) cost=(\d+) decision=(allowed|denied) source=(redis|local|fail_open|fail_closed|shadow|disabled|override) remaining=(\d+) retry_after_ms=(\d+) subject=([0-9a-f]{32})$/
		  )
		{
			@f{qw(policy version cost decision source remaining retry_after_ms subject)} =
			  ($1, $2, $3, $4, $5, $6, $7, $8);
		}
		push @lines, \%f;
	}
	return @lines;
}

$node->safe_psql('postgres', 'SELECT rl_stats_reset()');
my $log_version =
  $node->safe_psql('postgres', "SELECT version FROM rl_policy WHERE name = 'obs_log'");
my %hash_of = map {
	$_ => $node->safe_psql('postgres', 'SELECT rl_subject_hash(' . quote_literal($_) . ')')
} ($tenant, $email);
isnt($hash_of{$tenant}, $hash_of{$email}, 'two subjects, two hashes');

my $logger = session($node);
$logger->query_ok("SET ratelimit.log_decisions = 'all'");
my $offset = log_offset($node);
# What each decision should log: [cost, decision, source, remaining, retry_after_ms, subject].
my @expected;
for my $i (1 .. 6)
{
	my $d = $logger->consume('obs_log', $tenant);
	push @expected,
	  [ 1, $d->{allowed} eq 't' ? 'allowed' : 'denied', $d->{source}, $d->{remaining},
		$d->{retry_after_ms}, $hash_of{$tenant} ];
}
is_deeply([ map { $_->[1] } @expected ], [ ('allowed') x 5, 'denied' ],
	'obs_log: 5 allowed, then denied');
my $d = $logger->consume('obs_log', $email, 2);
push @expected, [ 2, 'allowed', $d->{source}, $d->{remaining}, $d->{retry_after_ms}, $hash_of{$email} ];
# A denied rl_enforce raises, and is logged; bad calls decide nothing and log no decision.
my ($out, $err) = $logger->query(decision_sql('obs_log', $tenant, 1, 'rl_enforce'));
is(sqlstate_of($err), 'RL429', 'rl_enforce of an empty bucket: RL429');
push @expected, [ 1, 'denied', 'redis', 0, undef, $hash_of{$tenant} ];
($out, $err) = $logger->query(decision_sql('obs_log', $tenant, 99));
is(sqlstate_of($err), '22023', 'a cost above the capacity: 22023');
($out, $err) = $logger->query(decision_sql('obs_no_such_policy', $tenant));
is(sqlstate_of($err), '42704', 'an unknown policy: 42704');
# A peek decides nothing that spends: no line.
$logger->query_ok("SELECT * FROM rl_peek('obs_log', " . quote_literal($email) . ')');
# Each check of rl_consume_all is a decision.
$out = $logger->query_ok(
	"SELECT allowed, remaining, retry_after_ms, source FROM rl_consume_all(ARRAY['obs_log'], ARRAY["
	  . quote_literal($email) . '])');
my @multi = split /\|/, $out;
push @expected,
  [ 1, $multi[0] eq 't' ? 'allowed' : 'denied', $multi[3], $multi[1], $multi[2], $hash_of{$email} ];

my @lines = decision_lines($node, $offset, $logger->pid);
my $decisions = stats('obs_log')->{decisions};
is($decisions, scalar @expected, 'rl_stats counts each decision that spends once');
is(scalar @lines, $decisions, "log_decisions = 'all': one line per decision ($decisions)")
  or diag explain \@lines;
my @malformed = grep { !defined $_->{policy} } @lines;
is_deeply(\@malformed, [], 'every line has the documented format') or diag explain \@malformed;
# Compare field by field (the enforce's retry_after_ms is not known here).
my @got = map { [ @$_{qw(policy version cost decision source remaining subject)} ] } @lines;
my @want = map { [ 'obs_log', $log_version, @$_[ 0 .. 3 ], $_->[5] ] } @expected;
is_deeply(\@got, \@want,
	'the lines say, in order, what each decision was, with rl_subject_hash for the subject')
  or diag explain { got => \@got, want => \@want };
my @retry_got = map { $lines[$_]{retry_after_ms} } grep { defined $expected[$_][4] } 0 .. $#expected;
my @retry_want = map { $_->[4] } grep { defined $_->[4] } @expected;
is_deeply(\@retry_got, \@retry_want, 'and the retry_after_ms each decision returned');

# 'denied': only the denials.
$offset = log_offset($node);
$logger->query_ok("SET ratelimit.log_decisions = 'denied'");
$logger->consume('obs_log', 'denied_mode_fresh');    # allowed: no line
$logger->consume('obs_log', $tenant);                # denied: a line
@lines = decision_lines($node, $offset, $logger->pid);
is_deeply([ map { "$_->{decision} $_->{subject}" } @lines ],
	["denied $hash_of{$tenant}"], "log_decisions = 'denied': the denial only");

# Sampled: about half of 2000 decisions; at 0, none; 'none', none.
my $loop = q{DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM rl_consume('obs_sample', 'sample_' || (i %% 20)); END LOOP; END $$};
$offset = log_offset($node);
$logger->query_ok("SET ratelimit.log_decisions = 'all'; SET ratelimit.log_sample_rate = 0.5");
$logger->query_ok(sprintf($loop, 2000));
my $sampled = grep { ($_->{policy} // '') eq 'obs_sample' } decision_lines($node, $offset);
ok($sampled >= 800 && $sampled <= 1200,
	"log_sample_rate = 0.5: $sampled lines for 2000 decisions (800 to 1200)");
is(stats('obs_sample')->{decisions}, 2000, 'sampling leaves rl_stats alone: 2000 decisions');
$offset = log_offset($node);
$logger->query_ok('SET ratelimit.log_sample_rate = 0');
$logger->query_ok(sprintf($loop, 300));
$logger->query_ok("SET ratelimit.log_sample_rate = 1; SET ratelimit.log_decisions = 'none'");
$logger->query_ok(sprintf($loop, 300));
is(scalar(decision_lines($node, $offset)), 0,
	"log_sample_rate = 0, then log_decisions = 'none': no line for 600 decisions");
is(stats('obs_sample')->{decisions}, 2600, 'all of them counted');
$logger->quit;

###
### (b) Redis that cannot answer.
###

$node->safe_psql('postgres', 'SELECT rl_stats_reset()');
$redis->stop;
my $down = session($node);
for my $i (1 .. 5)
{
	is($down->consume('obs_open', 'down_subject')->{source},
		'fail_open', "Redis stopped, call $i: fail_open");
	is($down->consume('obs_closed', 'down_subject')->{source},
		'fail_closed', "Redis stopped, call $i: fail_closed");
}
my %down_stats = map { $_ => stats($_) } qw(obs_open obs_closed);
is_deeply(
	[ map { @{ $down_stats{$_} }{qw(decisions source_fail_open source_fail_closed source_redis)} } qw(obs_open obs_closed) ],
	[ 5, 5, 0, 0, 5, 0, 5, 0 ],
	'Redis stopped: the decisions counted by fail mode');
my $connect_errors = sum0(map { $down_stats{$_}{redis_errors}{connect} // 0 } keys %down_stats);
cmp_ok($connect_errors, '>=', 1, "redis_errors has connect ($connect_errors)");
is_deeply(
	[ sort map { keys %{ $down_stats{$_}{redis_errors} } } keys %down_stats ],
	[ ('connect') x scalar(grep { %{ $down_stats{$_}{redis_errors} } } keys %down_stats) ],
	'and no other failure class');
is(sum0(map { $down_stats{$_}{redis_calls} } keys %down_stats), $connect_errors,
	'every Redis call made failed (those the breaker skipped are not counted)');
ok(!(grep { @{ $down_stats{$_}{latency_histogram} } || defined $down_stats{$_}{latency_max_ms} }
		keys %down_stats),
	'a failed call has no round trip');
$down->quit;

$redis->start;
my $back;
my $deadline = time + 10;
while (time < $deadline)
{
	$back = consume($node, 'obs_open', 'down_subject');
	last if $back->{source} eq 'redis';
	usleep(50_000);
}
is($back->{source}, 'redis', 'Redis started again: it decides again');

# Frozen Redis, a short command_timeout: a timeout.
$node->safe_psql('postgres', 'SELECT rl_stats_reset()');
my $t = session($node);
$t->query_ok("SET ratelimit.command_timeout = '100ms'");
is($t->consume('obs_timeout', 'timeout_subject')->{source}, 'redis', 'before the freeze: Redis');
$redis->pause;
my ($took, $frozen) = timed(sub { $t->consume('obs_timeout', 'timeout_subject') });
$redis->resume;
is($frozen->{source}, 'fail_open', sprintf('Redis frozen: fail_open after %.3f s', $took));
$s = stats('obs_timeout');
is_deeply(
	{ map { $_ => $s->{$_} } qw(decisions source_redis source_fail_open redis_calls redis_errors) },
	{
		decisions => 2,
		source_redis => 1,
		source_fail_open => 1,
		redis_calls => 2,
		redis_errors => { timeout => 1 }
	},
	'the timeout is counted as a Redis call that failed with class timeout')
  or diag explain $s;
is(round_trips($s->{latency_histogram}), 1, 'only the answered call has a round trip');
is($t->consume('obs_timeout', 'timeout_subject')->{source}, 'redis', 'after the thaw: Redis');
$t->quit;

###
### (e) The wait event of a backend waiting for Redis.
###

my $waiter = session($node);
my $watcher = session($node);
$waiter->query_ok("SET ratelimit.command_timeout = '5s'");
is($waiter->consume('obs_wait', 'wait_subject')->{source}, 'redis', 'the waiter is connected');
$redis->pause;
my $started = time;
$waiter->start_query(decision_sql('obs_wait', 'wait_subject'));
my $seen = '';
$deadline = time + 4;
while (time < $deadline)
{
	$seen = $watcher->query_ok(
		'SELECT wait_event_type || \'/\' || wait_event FROM pg_stat_activity WHERE pid = '
		  . $waiter->pid);
	last if $seen eq 'Extension/Extension';
	usleep(20_000);
}
is($seen, 'Extension/Extension',
	'pg_stat_activity: the waiting backend shows wait_event_type Extension, wait_event Extension');
$redis->resume;
my ($wait_out, $wait_err) = $waiter->wait_result(10);
my $waited = parse_decision($wait_out) // {};
is_deeply([ $waited->{allowed}, $waited->{source}, $wait_err ], [ 't', 'redis', '' ],
	'thawed: the call completes, decided by Redis');
cmp_ok(time - $started, '<', 5, 'before its 5 s timeout');
$waiter->quit;
$watcher->quit;

###
### (f) monitoring/postgres_exporter.yaml, run as a role that is only in pg_monitor.
###

# The file's queries: name => { query, metrics => [names], usage => {name => usage} }.
sub exporter_queries
{
	my ($file) = @_;
	my (%queries, $current, $in_query, $indent, $metric);
	foreach my $line (split /\n/, slurp_file($file))
	{
		next if $line =~ /^\s*#/;
		if ($line =~ /^([A-Za-z_]\w*):\s*$/)
		{
			$current = $1;
			$queries{$current} = { query => '', metrics => [], usage => {} };
			$in_query = 0;
			next;
		}
		next unless defined $current;
		if ($line =~ /^\s+query:\s*\|\s*$/)
		{
			($in_query, $indent) = (1, undef);
			next;
		}
		if ($in_query)
		{
			if ($line =~ /^\s*$/)
			{
				$queries{$current}{query} .= "\n";
				next;
			}
			my ($spaces) = $line =~ /^( *)/;
			$indent //= length $spaces;
			if (length $spaces >= $indent && $indent > 0)
			{
				$queries{$current}{query} .= substr($line, $indent) . "\n";
				next;
			}
			$in_query = 0;
		}
		if ($line =~ /^\s+-\s+([A-Za-z_]\w*):\s*$/)
		{
			$metric = $1;
			push @{ $queries{$current}{metrics} }, $metric;
		}
		elsif ($line =~ /^\s+usage:\s*"([A-Z]+)"\s*$/ && defined $metric)
		{
			$queries{$current}{usage}{$metric} = $1;
		}
	}
	return \%queries;
}

# Runs sql as user: (column names, rows as arrays); dies on an error.
sub rows_as
{
	my ($user, $sql) = @_;
	my ($stdout, $stderr) = ('', '');
	IPC::Run::run(
		[
			'psql', '-X', '-A', '-F', "\x1f", '-P', 'footer=off', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres') . " user=$user", '-f', '-'
		],
		'<', \$sql, '>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout(30))
	  or die "query as $user failed: $stderr\n$sql";
	die "query as $user wrote on stderr: $stderr\n$sql" if $stderr ne '';
	my @lines = split /\n/, $stdout;
	my @columns = split /\x1f/, shift(@lines) // '', -1;
	return (\@columns, [ map { [ split /\x1f/, $_, -1 ] } @lines ]);
}

my $schema = $node->safe_psql('postgres',
	"SELECT extnamespace::regnamespace FROM pg_extension WHERE extname = 'ratelimit'");
$node->safe_psql(
	'postgres', qq{
	CREATE ROLE rl_exporter LOGIN;
	GRANT pg_monitor TO rl_exporter;
	ALTER ROLE rl_exporter SET search_path = $schema;
});
is($node->safe_psql('postgres',
		q{SELECT string_agg(b.rolname, ',') FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid
		  JOIN pg_roles r ON r.oid = m.member WHERE r.rolname = 'rl_exporter'}),
	'pg_monitor', 'the exporter role is a member of pg_monitor only');
my ($priv_out, $priv_err) = ('', '');
IPC::Run::run(
	[
		'psql', '-X', '-A', '-t', '-v', 'VERBOSITY=verbose', '-d',
		$node->connstr('postgres') . ' user=rl_exporter',
		'-c', "SELECT rl_consume('obs_hist', 'x')"
	],
	'<', \undef, '>', \$priv_out, '2>', \$priv_err);
is(sqlstate_of($priv_err), '42501', 'the exporter role cannot spend budget');

# obs_hist: answered calls only, so its round trips are its Redis calls.
$node->safe_psql('postgres', "SELECT * FROM rl_consume('obs_hist', 'hist_$_')") for 1 .. 3;
$node->safe_psql('postgres',
	q{DO $$ BEGIN FOR i IN 1..40 LOOP PERFORM rl_consume('obs_hist', 'hist_' || (i % 7)); END LOOP; END $$});
my $hist = stats('obs_hist');
is($hist->{redis_calls}, 43, 'obs_hist: 43 Redis calls');
is(round_trips($hist->{latency_histogram}), 43, 'all of them answered');

my $file = dirname(__FILE__) . '/../../monitoring/postgres_exporter.yaml';
my $queries = exporter_queries($file);
is_deeply([ sort keys %$queries ],
	[qw(ratelimit ratelimit_health ratelimit_latency ratelimit_redis_errors)],
	'the exporter file has the four queries');
my %results;
foreach my $name (sort keys %$queries)
{
	my $q = $queries->{$name};
	like($q->{query}, qr/\bSELECT\b/i, "$name: a query was read");
	my ($columns, $result) = eval { rows_as('rl_exporter', $q->{query}) };
	is($@, '', "$name: runs as a member of pg_monitor");
	is_deeply($columns // [], $q->{metrics}, "$name: its columns are the metrics the file names")
	  or diag explain { columns => $columns, metrics => $q->{metrics} };
	is_deeply(
		[ grep { ($q->{usage}{$_} // '') !~ /^(?:LABEL|COUNTER|GAUGE)$/ } @{ $q->{metrics} } ],
		[], "$name: each metric has a usage");
	$results{$name} = [ map { my %r; @r{@$columns} = @$_; \%r } @{ $result // [] } ];
}

# The counters are rl_stats' own.
my ($exported) = grep { $_->{policy} eq 'obs_hist' } @{ $results{ratelimit} };
is_deeply(
	[ @{ $exported // {} }{qw(decisions allowed redis_calls)} ],
	[ @$hist{qw(decisions allowed redis_calls)} ],
	'ratelimit: the counters of obs_hist');
ok(abs(($exported->{latency_max_seconds} // -1) - $hist->{latency_max_ms} / 1000) < 1e-9,
	'ratelimit: latency_max_seconds is latency_max_ms / 1000');

# The failure classes, as rl_stats has them (obs_timeout: one timeout).
my %errors_exported =
  map { ("$_->{policy} $_->{class}" => $_->{total}) } @{ $results{ratelimit_redis_errors} };
my %errors_stats;
foreach my $row (split /\n/,
	$node->safe_psql('postgres', 'SELECT policy, redis_errors FROM rl_stats'))
{
	my ($policy, $errors) = split /\|/, $row, 2;
	my $e = $json->decode($errors);
	$errors_stats{"$policy $_"} = $e->{$_} for keys %$e;
}
is_deeply(\%errors_exported, \%errors_stats, 'ratelimit_redis_errors: the classes of rl_stats');
is($errors_exported{'obs_timeout timeout'}, 1, 'ratelimit_redis_errors: the timeout of obs_timeout');

# The histogram: cumulative buckets by le, ending with +Inf = every round trip.
my @buckets = grep { $_->{policy} eq 'obs_hist' } @{ $results{ratelimit_latency} };
my @by_le = sort { ($a->{le} eq '+Inf' ? 9e99 : $a->{le}) <=> ($b->{le} eq '+Inf' ? 9e99 : $b->{le}) }
  @buckets;
my @bounds = qw(0.00005 0.0001 0.00025 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1);
is_deeply([ map { $_->{le} } @by_le ], [ @bounds, '+Inf' ],
	'ratelimit_latency: the fixed bounds, in seconds, and +Inf');
my @not_cumulative =
  grep { $by_le[$_]{bucket} < $by_le[ $_ - 1 ]{bucket} } 1 .. $#by_le;
is_deeply(\@not_cumulative, [], 'ratelimit_latency: the buckets never decrease with le');
is(($by_le[-1] // {})->{bucket}, $hist->{redis_calls},
	'ratelimit_latency: the +Inf bucket is the Redis calls of obs_hist');
# Each bucket counts rl_stats' finer buckets that end at or below its bound.
my @expected_buckets = map {
	my $le_ms = $_ * 1000;
	my $n = 0;
	$n += $_->{count} foreach grep { $_->{le_ms} <= $le_ms + 1e-9 } @{ $hist->{latency_histogram} };
	$n
} @bounds;
is_deeply([ map { $_->{bucket} + 0 } @by_le[ 0 .. $#by_le - 1 ] ], \@expected_buckets,
	'ratelimit_latency: each bucket sums the finer buckets that end at or below le');
# histogram_quantile(..., sum by (le) (...)) adds the buckets of all policies le by le:
# that is a histogram only when every policy has the same bounds (a bound a policy
# leaves out is not 0 there, it is that policy's cumulative count). obs_bench made no
# round trip since its reset; obs_hist made 43.
my %les;
push @{ $les{ $_->{policy} } }, $_->{le} foreach @{ $results{ratelimit_latency} };
my %le_sets = map { join(',', sort @{ $les{$_} }) => $_ } keys %les;
ok(exists $les{obs_bench} && exists $les{obs_hist}, 'ratelimit_latency: a row set per policy');
is(scalar keys %le_sets, 1,
	'ratelimit_latency: every policy has the same le bounds, so that sum by (le) is a histogram')
  or diag explain { map { $_ => scalar @{ $les{$_} } } keys %les };

my ($health) = @{ $results{ratelimit_health} };
is_deeply([ @{ $health // {} }{qw(redis_reachable breaker_open)} ], [ 1, 0 ],
	'ratelimit_health: Redis reachable, the breaker closed');
# One row per node, labelled by it: no two rows share the label (the exporter refuses that).
my %nodes = map { ($_->{node} => 1) } @{ $results{ratelimit_health} };
is(scalar keys %nodes, scalar @{ $results{ratelimit_health} }, 'ratelimit_health: one row per node label');

# The Grafana dashboard (monitoring/grafana_dashboard.json) queries only metrics those
# queries produce (namespace_metric, counters and gauges), by labels they give (or the
# exporter's instance and the histogram's le).
{
	my %produced;    # metric => { label => 1 }
	foreach my $name (keys %$queries)
	{
		my $q = $queries->{$name};
		my @labels = grep { $q->{usage}{$_} eq 'LABEL' } @{ $q->{metrics} };
		foreach my $metric (grep { $q->{usage}{$_} ne 'LABEL' } @{ $q->{metrics} })
		{
			$produced{"${name}_$metric"} = { map { ($_ => 1) } @labels, 'instance', 'job' };
		}
	}
	my $dashboard = $json->decode(slurp_file(dirname(__FILE__) . '/../../monitoring/grafana_dashboard.json'));
	my @exprs = map { $_->{expr} } map { @{ $_->{targets} // [] } } @{ $dashboard->{panels} };
	push @exprs, map { $_->{query} } grep { ($_->{type} // '') eq 'query' } @{ $dashboard->{templating}{list} };
	cmp_ok(scalar @exprs, '>=', 12, 'grafana: the dashboard\'s queries were read (' . scalar(@exprs) . ')');
	my (@unknown, @bad_labels, %seen);
	foreach my $expr (@exprs)
	{
		my @metrics = $expr =~ /\b(ratelimit_[a-z0-9_]+)\b/g;
		push @unknown, grep { !$produced{$_} } @metrics;
		my @labels = ($expr =~ /\b(?:by|without)\s*\(([^)]*)\)/g, $expr =~ /\{([^}]*)\}/g,
			$expr =~ /label_values\([^,]+,\s*(\w+)\)/g);
		my @names = map { /^\s*(\w+)\s*(?:[=!~]|$)/ ? $1 : () } map { split /,/ } @labels;
		foreach my $label (@names)
		{
			next if $label eq 'le';
			push @bad_labels, "$label in $expr" if grep { $produced{$_} && !$produced{$_}{$label} } @metrics;
		}
		$seen{$_} = 1 for @metrics;
	}
	is_deeply(\@unknown, [], 'grafana: every metric the dashboard queries is one the exporter produces');
	is_deeply(\@bad_labels, [], 'grafana: every label it groups or filters by is one those metrics have');
	my @missing = grep { !$seen{$_} } qw(ratelimit_decisions ratelimit_denied ratelimit_source_redis
	  ratelimit_latency_bucket ratelimit_redis_errors_total ratelimit_health_breaker_open
	  ratelimit_health_redis_reachable);
	is_deeply(\@missing, [], 'grafana: decisions, denials, sources, latency, failures, breaker and health per node are shown');
}

###
### (c) Without shared_preload_libraries: no rl_stats, decisions all the same.
###

# Without preload a secret in postgresql.conf would be readable by every role: it comes
# from a file only the server's user can read.
my $secret_file = PostgreSQL::Test::Utils::tempdir() . '/subject_secret';
PostgreSQL::Test::Utils::append_to_file($secret_file, "$secret\n");
chmod 0600, $secret_file;
my $plain = rl_node('observability_nopreload', redis => $redis, preload => 0,
	conf => ["ratelimit.subject_secret_file = '$secret_file'"]);
$plain->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('obs_plain', 10, 10, '1 hour')});
my $p = session($plain);
($out, $err) = $p->query('SELECT * FROM rl_stats');
is(sqlstate_of($err), '55000', 'no preload: SELECT FROM rl_stats raises 55000');
like($err, qr/rl_stats needs ratelimit in shared_preload_libraries/, 'saying why');
($out, $err) = $p->query('SELECT rl_stats_reset()');
is(sqlstate_of($err), '55000', 'no preload: rl_stats_reset() raises 55000');
my $plain_offset = log_offset($plain);
$p->query_ok("SET ratelimit.log_decisions = 'all'");
$d = $p->consume('obs_plain', $tenant);
is_deeply([ $d->{allowed}, $d->{source}, $d->{remaining}, $d->{stderr} ], [ 't', 'redis', 9, '' ],
	'no preload: rl_consume decides in Redis');
my @plain_lines = decision_lines($plain, $plain_offset, $p->pid);
is_deeply([ map { "$_->{policy} $_->{decision} $_->{subject}" } @plain_lines ],
	["obs_plain allowed $hash_of{$tenant}"], 'no preload: the decision log works');
$p->quit;

###
### Databases apart: each sees its own policies' rows, and resets only them.
###

$node->safe_psql('postgres', 'CREATE DATABASE obs_db2');
my $shared_policy =
  q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period) VALUES ('obs_shared', 100, 100, '1 hour')};
$node->safe_psql('obs_db2', "CREATE EXTENSION ratelimit; $shared_policy");
$node->safe_psql('postgres', $shared_policy);
$node->safe_psql('postgres', "SELECT * FROM rl_consume('obs_shared', 'db_subject')");
$node->safe_psql('obs_db2',
	q{DO $$ BEGIN FOR i IN 1..3 LOOP PERFORM rl_consume('obs_shared', 'db_subject'); END LOOP; END $$});
my $count_in = sub {
	my ($db, $policy) = @_;
	return $node->safe_psql($db,
		'SELECT coalesce(sum(decisions), -1) FROM rl_stats WHERE policy = ' . quote_literal($policy));
};
is_deeply([ $count_in->('postgres', 'obs_shared'), $count_in->('obs_db2', 'obs_shared') ],
	[ 1, 3 ], 'the same policy name in two databases: two rows, each its own');
is($count_in->('obs_db2', 'obs_hist'), -1, 'a database sees no row of the policies of another');
$node->safe_psql('obs_db2', 'SELECT rl_stats_reset()');
is_deeply([ $count_in->('postgres', 'obs_shared'), $count_in->('obs_db2', 'obs_shared') ],
	[ 1, 0 ], "rl_stats_reset() zeroes its own database's rows only");

###
### (g) Beyond ratelimit.stats_policies (server-wide): "(other)".
###

my $own_sql = q{SELECT count(*) FROM rl_stats WHERE policy <> '(other)'};
my $own_postgres = $node->safe_psql('postgres', $own_sql);
my $own_before = $own_postgres + $node->safe_psql('obs_db2', $own_sql);
cmp_ok($own_before, '<', $stats_policies, "$own_before policies counted apart so far");
$node->safe_psql('postgres',
	q{INSERT INTO rl_policy (name, capacity, refill_amount, refill_period)
	  SELECT 'obs_many_' || i, 10, 10, '1 hour' FROM generate_series(1, 20) i});
$node->safe_psql('postgres',
	q{DO $$ BEGIN FOR i IN 1..20 LOOP PERFORM rl_consume('obs_many_' || i, 'many'); END LOOP; END $$});
my $apart = $stats_policies - $own_before;
is_deeply(
	[
		split /\|/,
		$node->safe_psql(
			'postgres', q{
		SELECT count(*) FILTER (WHERE policy <> '(other)'),
		       count(*) FILTER (WHERE policy LIKE 'obs_many_%'),
		       sum(decisions) FILTER (WHERE policy LIKE 'obs_many_%'),
		       sum(decisions) FILTER (WHERE policy = '(other)'),
		       sum(redis_calls) FILTER (WHERE policy = '(other)')
		FROM rl_stats})
	],
	[ $own_postgres + $apart, $apart, $apart, 20 - $apart, 20 - $apart ],
	"stats_policies = $stats_policies: $apart new policies get a row, the other "
	  . (20 - $apart) . ' are counted as (other)');

###
### The server logs never name the subjects.
###

foreach my $n ($node, $plain)
{
	my $log = slurp_file($n->logfile);
	unlike($log, qr/\Q$tenant\E/, $n->name . ': the log never names the safe-id subject');
	unlike($log, qr/\Q$email\E|alice\.visible/i, $n->name . ': nor the e-mail');
	unlike($log, qr/terminated by signal|TRAP:|PANIC:/, $n->name . ': no backend crashed');
}
like(slurp_file($node->logfile), qr/subject=\Q$hash_of{$tenant}\E/,
	'the log has the hash of the subject instead');

$plain->stop;
$node->stop;
$redis->stop;
done_testing();
