
# Who is being limited (0.12.0): rl_top's summaries, in shared memory, against a real Redis.
# - A skewed load (three heavy subjects among 100,000 one-shot ones): the top three exact
#   (error 0), and every count within its stated bound.
# - A uniform load: every count within count - error <= true <= count, error <= total / size.
# - Denials: the most denied subjects, exact.
# - A role without the privilege sees the subject's keyed hash, never the subject; a role
#   that may read rl_override sees it; PUBLIC cannot call it.
# - The summary forgets what is older than two periods; ratelimit.track_top = off counts
#   nothing; nothing of it in rl_stats or the server log.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use RateLimitTest;

my $size = 64;
my $redis = redis_start(name => 'top');
my $node = rl_node('top', redis => $redis,
	conf => [ "ratelimit.top_size = $size", "ratelimit.top_period = '10s'", "ratelimit.log_decisions = 'all'" ]);

$node->safe_psql(
	'postgres', q{
	SELECT rl_define('skew', 1000000000, per => '1 second');
	SELECT rl_define('uniform', 1000000000, per => '1 second');
	SELECT rl_define('deny', 1, per => '1 day', algorithm => 'fixed_window');
	SELECT rl_define('rot', 1000000, per => '1 second');
	SELECT rl_define('off', 1000000, per => '1 second');
	CREATE ROLE watcher IN ROLE pg_monitor;
	CREATE ROLE boss IN ROLE pg_monitor;
	GRANT SELECT ON rl_override TO boss;
	CREATE ROLE plain;
});

# Sections 1 to 4 decide on one injected time, so that they fall in one period of the
# summaries (a role that may not set the clock gets it by SET ROLE).
my $T0 = 1_700_000_000_000;
sub sql
{
	my ($query, $role) = @_;
	my $prefix = "SET ratelimit.test_clock_ms = '$T0';" . ($role ? " SET ROLE $role;" : '');
	return $node->safe_psql('postgres', "$prefix $query");
}

# Takes: n decisions of subject at cost each, in one batch.
sub takes
{
	my ($policy, $subject, $n, $cost) = @_;
	sql("SELECT count(*) FROM rl_consume_many('$policy', array_fill('$subject'::text, ARRAY[$n]), "
		  . "array_fill(${cost}::bigint, ARRAY[$n]))");
}

# rl_top's rows of kind as "subject:count:error" (rank order), for user.
sub top
{
	my ($policy, $kind, $user) = @_;
	return sql(
		"SELECT string_agg(coalesce(subject, 'NULL') || ':' || count || ':' || error, ' ' ORDER BY rank) "
		  . "FROM rl_top('$policy') WHERE kind = '$kind'", $user);
}

#
# 1. Skewed: three heavy subjects, then 100,000 one-shot subjects, then the heavy ones again.
#
takes('skew', 'h1', 1000, 5);
takes('skew', 'h2', 600, 5);
takes('skew', 'h3', 400, 5);
sql("SELECT count(*) FROM rl_consume_many('skew', ARRAY(SELECT 'cold' || g FROM generate_series(1, 100000) g))");
takes('skew', 'h1', 3000, 1);
takes('skew', 'h2', 2000, 1);
takes('skew', 'h3', 1000, 1);
my @rows = split / /, top('skew', 'taken');
is(scalar @rows, $size, "rl_top keeps $size subjects per kind");
is(join(' ', @rows[0 .. 2]), 'h1:8000:0 h2:5000:0 h3:3000:0',
	'skewed: the three heavy subjects first, their counts exact (error 0)');
my ($total) = sql("SELECT DISTINCT total FROM rl_top('skew') WHERE kind = 'taken'");
is($total, 116000, 'total: every token taken (16,000 heavy, 100,000 one-shot)');
my $bad = grep {
	my (undef, $count, $error) = split /:/;
	!($count - $error <= 1 && $count >= 1 && $error <= $total / $size)
} @rows[ 3 .. $#rows ];
is($bad, 0, "skewed: each one-shot subject's count - error <= 1 <= count, error <= total / $size");

#
# 2. Uniform: 2,000 subjects, 5 tokens each.
#
sql("SELECT count(*) FROM rl_consume_many('uniform', ARRAY(SELECT 'u' || g FROM generate_series(1, 2000) g))")
  for 1 .. 5;
@rows = split / /, top('uniform', 'taken');
($total) = sql("SELECT DISTINCT total FROM rl_top('uniform') WHERE kind = 'taken'");
is($total, 10000, 'uniform: 10,000 tokens counted');
$bad = grep {
	my (undef, $count, $error) = split /:/;
	!($count - $error <= 5 && 5 <= $count && $error <= $total / $size)
} @rows;
is($bad, 0, "uniform: every row within its bound: count - error <= 5 <= count, error <= total / $size ("
	  . scalar(@rows) . ' rows)');

#
# 3. Denials: one token a day each, d1 asks 500 times, d2 200 times, 20,000 others once.
#
takes('deny', 'd1', 500, 1);
takes('deny', 'd2', 200, 1);
sql("SELECT count(*) FROM rl_consume_many('deny', ARRAY(SELECT 'o' || g FROM generate_series(1, 20000) g))");
is(top('deny', 'denied'), 'd1:499:0 d2:199:0', 'the most denied: d1 (499) and d2 (199), exact; one grant each is not a denial');
is(sql("SELECT DISTINCT total FROM rl_top('deny') WHERE kind = 'taken'"), '20002',
	'their grants are counted as taken (20,002 tokens; one each is below the bound, so not listed)');

#
# 4. Who may see subjects.
#
my $h1 = sql("SELECT rl_subject_hash('h1')");
is(sql("SELECT coalesce(subject, 'NULL') || ' ' || subject_hash FROM rl_top('skew') WHERE kind = 'taken' AND rank = 1",
		'watcher'),
	"NULL $h1", 'pg_monitor alone: the subject is NULL, its keyed hash (rl_subject_hash) shown');
like(top('skew', 'taken', 'boss'), qr/^h1:8000:0 /, 'a role that may read rl_override sees the subject');
my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE plain; SELECT * FROM rl_top('skew')");
like($err, qr/permission denied/, 'a role without pg_monitor cannot call rl_top');
($rc, $out, $err) = $node->psql('postgres', "\\set VERBOSITY verbose\nSELECT * FROM rl_top(NULL)");
like($err, qr/22004/, 'a NULL policy is refused with 22004');
is(sql("SELECT count(*) FROM rl_top('no.such')"), '0', 'a policy that never decided has no rows');

#
# 5. Periods: the summary shows the last one or two periods of 10 s (on the injected clock).
#
my $t = 1_800_000_000_000;    # a multiple of 10 s
sub at { my ($ms, $q) = @_; return $node->safe_psql('postgres', "SET ratelimit.test_clock_ms = '$ms'; $q") }
at($t + 1000, "SELECT count(*) FROM rl_consume_many('rot', array_fill('r1'::text, ARRAY[7]))");
is(at($t + 9000, "SELECT count FROM rl_top('rot') WHERE kind = 'taken'"), '7', 'within the period: counted');
at($t + 12000, "SELECT count(*) FROM rl_consume_many('rot', array_fill('r1'::text, ARRAY[3]))");
is(at($t + 19000, "SELECT count FROM rl_top('rot') WHERE kind = 'taken'"), '10', 'the next period adds to the last one');
is(at($t + 25000, "SELECT count FROM rl_top('rot') WHERE kind = 'taken'"), '3', 'two periods on: the first is forgotten');
is(at($t + 45000, "SELECT count(*) FROM rl_top('rot')"), '0', 'and after two idle periods, nothing');

# The merge of two periods: a period whose counters were all taken and that lacks a subject
# adds its smallest count to the subject's count and error, so the bound holds.
at($t + 31000, "SELECT count(*) FROM rl_consume_many('rot', ARRAY(SELECT 'p' || g FROM generate_series(1, 100) g))");
at($t + 41000, "SELECT count(*) FROM rl_consume_many('rot', array_fill('known'::text, ARRAY[5]))");
my ($kc, $ke) = split /\|/, at($t + 41000, "SELECT count, error FROM rl_top('rot') WHERE kind = 'taken' AND subject = 'known'");
is($kc - $ke, 5, 'merged over a full period that lacks it: count - error is its true weight (5)');
cmp_ok($ke, '>', 0, "and the full period's smallest count is in its error ($ke)");

#
# 6. Switched off, and never in a metric or a log line.
#
sql("SET ratelimit.track_top = off; SELECT count(*) FROM rl_consume_many('off', array_fill('x'::text, ARRAY[5]))");
takes('off', 'y', 1, 1);
is(sql("SELECT string_agg(subject || count, ' ') FROM rl_top('off')"), 'y1', 'ratelimit.track_top = off counted nothing (x), on again counts (y)');
unlike(sql("SELECT string_agg(s::text, ' ') FROM rl_stats s"), qr/\bh1\b|cold1\b/, 'rl_stats names no subject');
unlike(slurp_file($node->logfile), qr/\bh1\b|\bcold\d+\b|\bd1\b/, 'the server log names no subject');

#
# 7. Summaries given to new policies: two summaries for three policies. A policy idle for
#    two periods gives its summary up; a backend that had found it finds its policy's again.
#
my $small = rl_node('top_small', redis => $redis,
	conf => [ 'ratelimit.top_policies = 2', "ratelimit.top_period = '10s'" ]);
$small->safe_psql('postgres', q{
	SELECT rl_define('pa', 1000, per => '1 second');
	SELECT rl_define('pb', 1000, per => '1 second');
	SELECT rl_define('pc', 1000, per => '1 second');
});
sub small_at { my ($ms, $q) = @_; return $small->safe_psql('postgres', "SET ratelimit.test_clock_ms = '$ms'; $q") }
my $kept = RateLimitTest::session($small);
$kept->query_ok("SET ratelimit.test_clock_ms = '$t'");
$kept->query_ok("SELECT count(*) FROM rl_consume_many('pa', array_fill('a1'::text, ARRAY[2]))");
small_at($t, "SELECT count(*) FROM rl_consume_many('pb', array_fill('b1'::text, ARRAY[3]))");
small_at($t, "SELECT count(*) FROM rl_consume_many('pc', array_fill('c1'::text, ARRAY[4]))");
is(small_at($t, "SELECT string_agg(p || '=' || coalesce((SELECT string_agg(subject || count, ',') FROM rl_top(p)), '-'), ' ') FROM unnest(ARRAY['pa', 'pb', 'pc']) p"),
	'pa=a12 pb=b13 pc=-', 'two summaries: the third policy has none');
my $later = $t + 35000;    # three periods on: pa and pb idle for two
small_at($later, "SELECT count(*) FROM rl_consume_many('pc', array_fill('c1'::text, ARRAY[4]))");
$kept->query_ok("SET ratelimit.test_clock_ms = '$later'");
$kept->query_ok("SELECT count(*) FROM rl_consume_many('pa', array_fill('a1'::text, ARRAY[6]))");
is(small_at($later, "SELECT string_agg(p || '=' || coalesce((SELECT string_agg(subject || count, ',') FROM rl_top(p)), '-'), ' ') FROM unnest(ARRAY['pa', 'pb', 'pc']) p"),
	'pa=a16 pb=- pc=c14',
	'later: pc took an idle summary; the backend whose pa summary was given away counted in pa\'s new one, not in pc\'s');
$kept->quit;
$small->stop;

done_testing();
