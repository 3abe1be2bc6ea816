
# Reservations that follow the transaction, against a real redis-server: a
# backend that is terminated (or whose client goes away) in the middle of a
# transaction refunds its reservations on the way out; a refund id credits
# once however often it is replayed; with Redis frozen (SIGSTOP) the ROLLBACK
# of a transaction holding several reservations costs one command_timeout,
# raises nothing and logs the lost refunds without the subject; rl_refund and
# rl_reset leave an audit line without the subject; and a 'local' policy's
# reservation made while Redis is down goes back to the local bucket.

use strict;
use warnings;

use FindBin;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $command_timeout_ms = 300;
my $retry_ms = 500;
my $redis = redis_start(name => 'transactions');
my $node = rl_node(
	'transactions',
	redis => $redis,
	conf => [
		"ratelimit.command_timeout = '${command_timeout_ms}ms'",
		"ratelimit.connect_timeout = '200ms'",
		"ratelimit.retry_interval = '${retry_ms}ms'",
	]);

# 10 tokens, 10 a day: one token every 8640 s, so nothing refills during the test
# (levels read as whole tokens are exact).
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('tx_kill', 10, 10, '1 day', 'closed'),
	  ('tx_once', 10, 10, '1 day', 'closed'),
	  ('tx_pause', 10, 10, '1 day', 'closed'),
	  ('tx_audit', 10, 10, '1 day', 'closed'),
	  ('tx_local', 10, 10, '1 day', 'local'),
	  ('tx_closed', 10, 10, '1 day', 'closed');
});
my %version = map {
	$_ => $node->safe_psql('postgres', "SELECT version FROM rl_policy WHERE name = '$_'")
} qw(tx_kill tx_once);

# "remaining|source" of rl_peek in a new session: takes nothing.
sub peek
{
	my ($policy, $subject) = @_;
	return $node->safe_psql('postgres',
		sprintf('SELECT remaining, source FROM rl_peek(%s, %s)',
			quote_literal($policy), quote_literal($subject)));
}

# The bucket's Redis key (see subject_build_key in src/subject.c: a safe id as it is).
sub bucket_key
{
	my ($policy, $subject) = @_;
	return "rl:postgres:v$version{$policy}" . key_installation($node) . ":{$subject}:$policy";
}

###
### A backend terminated in the middle of a transaction refunds its reservations.
###

my $kill_subject = 'kill_subject_7f';
my $victim = session($node);
$victim->query_ok('BEGIN');
foreach my $cost (1, 2, 3)
{
	my ($out, $err) =
	  $victim->query("SELECT allowed, source FROM rl_reserve('tx_kill', '$kill_subject', $cost)");
	is("$out$err", 't|redis', "victim: rl_reserve of $cost granted by Redis");
}
is(peek('tx_kill', $kill_subject), '4|redis',
	'while the transaction runs, another session sees the 6 reserved tokens gone');

my $offset = log_offset($node);
my $victim_pid = $victim->pid;
# With a timeout, pg_terminate_backend waits until the backend has left the
# process array, which it does after aborting its transaction.
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($victim_pid, 10000)"),
	't', 'pg_terminate_backend ended the backend');
ok(backend_gone($node, $victim_pid), 'the terminated backend is gone');
$victim->quit;
is(peek('tx_kill', $kill_subject), '10|redis',
	'the terminated backend refunded all three reservations on its way out');

my $log = log_since($node, $offset);
like($log, qr/terminating connection due to administrator command/,
	'the log shows the termination');
unlike($log, qr/not (?:have been )?refunded/, 'no refund was lost');
unlike($log, qr/\Q$kill_subject\E/, 'the log never names the subject');

# The three reservations of one bucket in one transaction share one refund: one
# mark, named by the backend's reservation id, living a minute at most.
my $bucket = bucket_key('tx_kill', $kill_subject);
my @marks = grep { /\A\Q$bucket\E:refund:/ } $redis->scan_keys;
is(scalar @marks, 1, 'one refund mark for the three reservations of one bucket')
  or diag explain [ $redis->scan_keys ];
ok(!(grep { !/:refund:$victim_pid\.[0-9a-f]+\.\d+\z/ } @marks),
	'the mark is <bucket key>:refund:<pid>.<random nonce>.<counter>')
  or diag explain \@marks;
foreach my $mark (@marks)
{
	my $pttl = $redis->cli('PTTL', $mark);
	ok($pttl > 0 && $pttl <= 60_000, "the mark expires (PTTL $pttl ms, a minute at most)");
}

# Replaying the script with those very marks credits nothing: the tokens were
# given back once. (Take 5 first, so that a credit would show below capacity.)
my $script = `"$FindBin::Bin/../../dev/lua-script" "$FindBin::Bin/../../lua/token_bucket/refund.lua"`;
die "dev/lua-script failed" if $? != 0 || $script eq '';
# Policy 10 per day, in the script's integer units (src/algorithm/token_bucket.c): gcd(10, 86400000)
# = 10, unit = 8640000 units a token, rate = 1 unit a ms, capacity 86400000 units,
# TTL the time to refill completely, 86400000 ms.
my @args = (86_400_000, 1, 8_640_000);
my $ttl_ms = 86_400_000;

# Runs the refund script by hand: (allowed, remaining, retry_after_ms, reset_after_ms).
sub lua_refund
{
	my ($key, $mark, $cost) = @_;
	return split /\n/, $redis->cli('EVAL', $script, 2, $key, $mark, '', @args, $cost, $ttl_ms);
}

is($node->safe_psql('postgres', "SELECT remaining FROM rl_consume('tx_kill', '$kill_subject', 5)"),
	'5', 'rl_consume takes 5 tokens');
foreach my $mark (@marks)
{
	my @r = lua_refund($bucket, $mark, 3);
	is("$r[0]|$r[1]", '0|5', 'a replayed refund of a reservation id credits nothing');
}
is(peek('tx_kill', $kill_subject), '5|redis', 'the bucket still holds 5');

###
### The client goes away in the middle of a transaction: the same.
###

my $leaver = session($node);
$leaver->query_ok('BEGIN');
is($leaver->query_ok("SELECT remaining FROM rl_reserve('tx_kill', 'leaver_subject', 7)"),
	'3', 'leaver: 7 reserved');
my $leaver_pid = $leaver->pid;
$leaver->quit;
ok(backend_gone($node, $leaver_pid), 'the backend of the client that went away ended');
is(peek('tx_kill', 'leaver_subject'), '10|redis',
	'its reservation was refunded when the backend ended');

###
### A refund id credits once, however often the script runs with it.
###

my $once_subject = 'once_subject_2b';
is($node->safe_psql('postgres', "SELECT remaining FROM rl_consume('tx_once', '$once_subject', 6)"),
	'4', 'rl_consume takes 6 tokens');
my $once_bucket = bucket_key('tx_once', $once_subject);
ok((grep { $_ eq $once_bucket } $redis->scan_keys),
	"the bucket's key is $once_bucket");
my $once_mark = "$once_bucket:refund:by-hand.1";

my @first = lua_refund($once_bucket, $once_mark, 3);
is("$first[0]|$first[1]", '1|7', 'the first refund with an id credits 3: 7 left');
my @second = lua_refund($once_bucket, $once_mark, 3);
is("$second[0]|$second[1]", '0|7', 'the same id again credits nothing: still 7');
is(peek('tx_once', $once_subject), '7|redis', 'rl_peek sees 7 tokens');
my $mark_pttl = $redis->cli('PTTL', $once_mark);
ok($mark_pttl > 0 && $mark_pttl <= $ttl_ms, "the mark expires (PTTL $mark_pttl ms)");
my @other = lua_refund($once_bucket, "$once_bucket:refund:by-hand.2", 2);
is("$other[0]|$other[1]", '1|9', 'another id is another refund: 9 left');
my @capped = lua_refund($once_bucket, "$once_bucket:refund:by-hand.3", 5);
is("$capped[0]|$capped[1]", '1|10', 'a refund never fills a bucket above its capacity');
is(peek('tx_once', $once_subject), '10|redis', 'rl_peek sees a full bucket');

###
### Redis frozen: the ROLLBACK of 5 reservations costs one command_timeout.
###

my @pause_subjects = ('pause_tenant_a1', 'pause_tenant_b2', 'carol@example.com',
	'pause_tenant_c3', 'pause_tenant_d4');
my $s = session($node);
$s->query_ok('BEGIN');
foreach my $subject (@pause_subjects)
{
	my ($out, $err) = $s->query(
		sprintf("SELECT allowed, remaining, source FROM rl_reserve('tx_pause', %s, 1)",
			quote_literal($subject)));
	is("$out$err", 't|9|redis', "rl_reserve granted by Redis (subject " . length($subject) . ' bytes)');
}

$offset = log_offset($node);
$redis->pause;
my ($secs, $out, $err) = timed(sub { $s->query('ROLLBACK', 30) });
$redis->resume;
my $limit = $command_timeout_ms / 1000 + 1;
note sprintf 'ROLLBACK with Redis paused took %.3f s', $secs;
cmp_ok($secs, '<', $limit,
	sprintf('ROLLBACK of 5 reservations with Redis paused took %.3f s: under command_timeout + 1 s', $secs));
is($err, '', 'the ROLLBACK raised nothing (no ERROR, no WARNING)');
is($s->query_ok('SELECT now() = statement_timestamp()'), 't',
	'the session is out of the transaction and usable');

ok(wait_for_log($node, qr/may not have been refunded/, $offset), 'the lost refunds are logged');
$log = log_since($node, $offset);
my @lost = $log =~ /ratelimit: (\d+) reservations may not have been refunded: Redis did not answer within ratelimit.command_timeout\n.*DETAIL:  Policies: "tx_pause" \(5\)\./g;
is_deeply(\@lost, [5], 'one line for the 5 lost refunds: their count, the reason and the policy')
  or diag $log;
unlike($log, qr/pause_tenant|carol|example\.com|rl:postgres|\{/,
	'the log names no subject and no key');
unlike($log, qr/\bERROR\b|PANIC|server process .* terminated/, 'no error and no crash in the log');

# Redis answers again once the breaker lets a probe through.
ok( $node->poll_query_until(
		'postgres', "SELECT source = 'redis' FROM rl_peek('tx_pause', 'pause_probe')"),
	'Redis decides again after it wakes up');
# Never more than capacity, never less than what was reserved. (A refund sent
# just before the deadline may still run once Redis wakes up: it is done once.)
my @after = map { peek('tx_pause', $_) } @pause_subjects;
note 'levels after Redis woke up: ' . join(', ', @after);
ok(!(grep { $_ ne '9|redis' && $_ ne '10|redis' } @after),
	'each bucket holds 9 (refund lost) or 10 (refunded once), never more')
  or diag explain \@after;
$s->quit;

###
### rl_refund and rl_reset leave an audit line, without the subject.
###

$offset = log_offset($node);
my $audit = session($node);
is($audit->query_ok("SELECT remaining FROM rl_consume('tx_audit', 'audit_subject_9q', 8)"),
	'2', 'rl_consume takes 8');
is($audit->query_ok("SELECT allowed, remaining, source FROM rl_refund('tx_audit', 'audit_subject_9q', 3)"),
	't|5|redis', 'rl_refund gives 3 back');
is($audit->query_ok("SELECT rl_reset('tx_audit', 'dave\@example.com')"), 't', 'rl_reset answers true');
is($audit->query_ok("SELECT rl_reset('tx_audit', 'audit_subject_9q')"), 't', 'rl_reset answers true');
is(peek('tx_audit', 'audit_subject_9q'), '10|redis', 'after rl_reset the bucket is full');
ok(wait_for_log($node, qr/ratelimit: reset on policy "tx_audit"/, $offset), 'the resets are logged');
$log = log_since($node, $offset);
like($log, qr/LOG:  ratelimit: refund on policy "tx_audit"/, 'the refund is logged with its policy');
is(scalar(() = $log =~ /ratelimit: reset on policy "tx_audit"/g), 2, 'each reset is logged');
unlike($log, qr/audit_subject|dave|example\.com|rl:postgres/, 'the audit lines name no subject and no key');
$audit->quit;

###
### 'local' with Redis down: a reservation granted locally goes back to the local bucket.
###

$redis->stop;
my $local = session($node);
$local->query_ok('BEGIN');
is($local->query_ok("SELECT allowed, remaining, source FROM rl_reserve('tx_local', 'local_subject_3', 4)"),
	't|6|local', 'with Redis down, the local bucket grants the reservation');
is(peek('tx_local', 'local_subject_3'), '6|local', 'another session sees the local bucket at 6');
$local->query_ok('SAVEPOINT a');
is($local->query_ok("SELECT allowed, remaining, source FROM rl_reserve('tx_local', 'local_subject_3', 3)"),
	't|3|local', 'a second reservation in a savepoint');
$local->query_ok('ROLLBACK TO SAVEPOINT a');
is(peek('tx_local', 'local_subject_3'), '6|local', 'ROLLBACK TO SAVEPOINT gives its 3 back');
# A closed policy denies: nothing is reserved, so nothing will be refunded.
is($local->query_ok("SELECT allowed, source FROM rl_reserve('tx_closed', 'local_subject_3', 1)"),
	'f|fail_closed', "a 'closed' policy's reservation is denied");
$offset = log_offset($node);
($secs, $out, $err) = timed(sub { $local->query('ROLLBACK') });
is($err, '', 'the ROLLBACK raised nothing');
is(peek('tx_local', 'local_subject_3'), '10|local', 'ROLLBACK gave the local tokens back');
note sprintf 'ROLLBACK of a local reservation took %.3f s', $secs;
$log = log_since($node, $offset);
unlike($log, qr/not (?:have been )?refunded/, 'no refund was lost (none was owed to Redis)');
$local->query_ok('BEGIN');
$local->query_ok("SELECT rl_reserve('tx_local', 'local_subject_3', 2)");
$local->query_ok('COMMIT');
is(peek('tx_local', 'local_subject_3'), '8|local', 'a committed local reservation stays spent');
$local->quit;
$redis->start;

done_testing();
