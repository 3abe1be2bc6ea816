
# Budgets for real work (0.10.0), against a real Redis:
# - max_wait: a take that does not fit books the earliest time it will (later
#   callers queue behind it) and sleeps until then; grants come in arrival
#   order, paced by cost / rate, never over the policy; a cancel or a
#   statement_timeout ends the wait at once and gives the booking back; Redis
#   silent: the fail mode; bookings bounded per subject by max_debt; a fixed
#   window books the next window; a lease waits for a release.
# - rl_settle: a take settled down gives back, settled up takes the difference
#   even beyond empty, owing at most max_debt; a reservation follows, so a
#   rollback gives back what was really taken.
# - request_id: the same id again takes nothing (a replay), a rolled-back
#   reservation forgets its id, and 64 racing sessions reusing 100 ids on 100
#   tokens are charged exactly 100.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $clients = 64;
my $redis = redis_start(name => 'wait');
my $node = rl_node('wait', redis => $redis, max_connections => $clients + 30,
	conf => ["ratelimit.command_timeout = '5s'", "ratelimit.retry_interval = '200ms'"]);

$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, algorithm, capacity, refill_amount, refill_period, max_debt, fail_mode) VALUES
	  ('pace', 'token_bucket', 1, 1, '100 ms', 100, 'closed'),
	  ('slow', 'token_bucket', 1, 1, '1 second', 10, 'closed'),
	  ('big', 'token_bucket', 10, 10, '1 second', NULL, 'closed'),
	  ('bounded', 'token_bucket', 1, 1, '1 second', 3, 'closed'),
	  ('g', 'gcra', 2, 1, '100 ms', NULL, 'closed'),
	  ('llm', 'token_bucket', 1000, 1000, '1 hour', 500, 'closed'),
	  ('llm_open', 'token_bucket', 1000, 1000, '1 hour', 500, 'open'),
	  ('ids', 'token_bucket', 100, 1, '1 day', NULL, 'closed'),
	  ('short_memory', 'token_bucket', 100, 1, '1 day', NULL, 'closed'),
	  ('huge', 'token_bucket', 300000000000000, 1, '1 ms', NULL, 'closed');
	INSERT INTO rl_policy (name, algorithm, capacity, refill_period) VALUES
	  ('fw', 'fixed_window', 2, '2 seconds'),
	  ('fw10', 'fixed_window', 2, '10 seconds'),
	  ('sw', 'sliding_window', 2, '2 seconds');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('lease', 'concurrency', 1, '1 minute');
	UPDATE rl_policy SET replay_window = '300 ms' WHERE name = 'short_memory';
	CREATE TABLE grants (seq int, allowed boolean, waited_ms bigint, at_ms bigint);
});

# The SQL of a take that may wait, answering allowed|waited_ms|its end on this clock (ms).
sub waiting_take
{
	my ($policy, $subject, $cost, $max_wait) = @_;
	return "SELECT allowed, waited_ms, (extract(epoch FROM clock_timestamp()) * 1000)::bigint "
	  . "FROM rl_consume('$policy', '$subject', $cost, max_wait => '$max_wait')";
}

#
# 1. Twenty sessions waiting on 10 a second, 1 each: served in arrival order, ~100 ms apart.
#
my @sessions = map { session($node) } 1 .. 20;
$_->query_ok('SELECT 1') foreach @sessions;
my $t0 = time;
foreach my $s (@sessions)
{
	$s->start_query(waiting_take('pace', 'job', 1, '5 seconds'));
	usleep(15_000);    # arrival order is sending order
}
my @ends;
foreach my $i (0 .. $#sessions)
{
	my ($allowed, $waited, $end) = split /\|/, $sessions[$i]->wait_result;
	is($allowed, 't', "waiter $i is granted");
	push @ends, $end;
}
my @gaps = map { $ends[$_] - $ends[ $_ - 1 ] } 1 .. $#ends;
my @in_order = grep { $gaps[$_] >= 0 } 0 .. $#gaps;
is(scalar @in_order, scalar @gaps, 'grants come in order of arrival');
my @sorted = sort { $a <=> $b } @gaps;
my $median = $sorted[ int(@sorted / 2) ];
note "gaps between grants (ms): @gaps; median $median, min $sorted[0], max $sorted[-1]";
cmp_ok($median, '>=', 90, 'the median gap is about 100 ms (at least 90)');
cmp_ok($median, '<=', 130, 'the median gap is about 100 ms (at most 130)');
# Never over the policy: in any second, at most capacity + 10 grants (1 + 10).
my $worst = 0;
foreach my $i (0 .. $#ends)
{
	my $in = grep { $_ >= $ends[$i] && $_ < $ends[$i] + 1000 } @ends;
	$worst = $in if $in > $worst;
}
cmp_ok($worst, '<=', 11, "never over the policy: at most 11 grants in any second ($worst)");
cmp_ok($ends[-1] - $ends[0], '>=', 19 * 100 - 20, 'the twentieth grant is 1.9 s after the first');

#
# 2. A cost of the whole capacity, waiting, is granted within capacity / rate while
#    cost-1 traffic continues (without a wait it never is: the bucket never fills).
#
my $traffic = session($node);
$traffic->start_query(q{DO $$ BEGIN FOR i IN 1..150 LOOP
	PERFORM rl_consume('big', 'tenant', 1); PERFORM pg_sleep(0.02); END LOOP; END $$});
usleep(500_000);
my @plain = map { $sessions[0]->consume('big', 'tenant', 10) } 1 .. 3;
is(scalar(grep { $_->{allowed} eq 't' } @plain), 0, 'without a wait, cost = capacity is denied while cost-1 traffic runs');
my ($allowed, $waited) = split /\|/, $sessions[0]->query(waiting_take('big', 'tenant', 10, '3 seconds'));
is($allowed, 't', 'with max_wait, cost = capacity is granted while cost-1 traffic runs');
cmp_ok($waited, '<=', 1100, "within capacity / rate of its arrival (waited $waited ms)");
$traffic->wait_result;

#
# 3. A cancel and a statement_timeout end a wait at once and give the booking back.
#
$sessions[0]->query_ok("SELECT rl_consume('slow', 'q', 1)");    # empty: the next token in 1 s
$sessions[1]->start_query(waiting_take('slow', 'q', 1, '10 seconds'));    # booked at ~1 s
usleep(100_000);
$sessions[2]->start_query(waiting_take('slow', 'q', 1, '10 seconds'));    # booked at ~2 s
usleep(200_000);
my $pid = $sessions[2]->pid;
my $cancelled_at = time;
$node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
my ($out, $err) = $sessions[2]->wait_result;
my $cancel_s = time - $cancelled_at;
like($err, qr/57014|canceling statement/, 'a cancel ends the wait with 57014');
cmp_ok($cancel_s, '<', 0.5, "at once ($cancel_s s)");
# Its turn (~2 s) is given back: the next caller books it instead of ~3 s.
my $peek = parse_decision($sessions[3]->query(decision_sql('slow', 'q', 1, 'rl_peek')));
cmp_ok($peek->{retry_after_ms}, '<', 1900, "the next caller is served earlier: retry $peek->{retry_after_ms} ms, not ~2700");
my ($first) = split /\|/, $sessions[1]->wait_result;
is($first, 't', 'the waiter before the cancelled one is still served');

# A wait longer than max_wait is not booked at all: a denial as without max_wait.
$sessions[0]->query_ok("SELECT rl_consume('slow', 'nb', 1)");
my ($nb_allowed, $nb_waited) = split /\|/, $sessions[0]->query(waiting_take('slow', 'nb', 1, '100 ms'));
is("$nb_allowed/$nb_waited", 'f/0', 'a wait longer than max_wait is denied at once');
my $nb = parse_decision($sessions[0]->query(decision_sql('slow', 'nb', 1, 'rl_peek')));
cmp_ok($nb->{retry_after_ms}, '<=', 1000, "and books nothing (retry $nb->{retry_after_ms} ms, not ~2000)");

$sessions[4]->query_ok("SET statement_timeout = '300ms'");
my $before = parse_decision($sessions[3]->query(decision_sql('slow', 'q', 1, 'rl_peek')))->{retry_after_ms};
my $start = time;
($out, $err) = $sessions[4]->query(waiting_take('slow', 'q', 1, '10 seconds'));
my $timeout_s = time - $start;
like($err, qr/57014|statement timeout/, 'statement_timeout ends the wait with 57014');
cmp_ok($timeout_s, '<', 1.0, "at its timeout ($timeout_s s)");
my $after = parse_decision($sessions[3]->query(decision_sql('slow', 'q', 1, 'rl_peek')))->{retry_after_ms};
cmp_ok($after, '<=', $before, "its booking is given back (retry $before ms before, $after ms after)");
$sessions[4]->query_ok("RESET statement_timeout");

#
# 4. Bookings are bounded per subject (max_debt): nobody books far ahead for everyone.
#
$sessions[0]->query_ok("SELECT rl_consume('bounded', 'crowd', 1)");
$_->start_query(waiting_take('bounded', 'crowd', 1, '1 day')) foreach @sessions[ 5 .. 10 ];
my @crowd = map { [ split /\|/, $_->wait_result ] } @sessions[ 5 .. 10 ];
my $booked = grep { $_->[0] eq 't' } @crowd;
is($booked, 3, 'with max_debt 3, three waiters book (1 token a second) and three are denied');
my @denied_waits = map { $_->[1] } grep { $_->[0] eq 'f' } @crowd;
is_deeply(\@denied_waits, [ 0, 0, 0 ], 'a waiter beyond the debt is denied at once, waiting nothing');
($out, $err) = $sessions[0]->query("SELECT rl_consume('bounded', 'x', 1, max_wait => '2 days')");
like($err, qr/22023|at most a day/, 'a max_wait over a day is refused with 22023');
($out, $err) = $sessions[0]->query("SELECT rl_consume('sw', 'x', 1, max_wait => '1 second')");
like($err, qr/0A000|cannot book a wait/, 'a sliding window cannot book a wait: 0A000');
($out, $err) = $sessions[0]->query("SELECT rl_consume('pace', 'x', 1, max_wait => '-1 second')");
like($err, qr/22023/, 'a negative max_wait is refused with 22023');

#
# 5. GCRA books refill to come; a fixed window books the next window, which then holds it.
#
$sessions[0]->query_ok("SELECT rl_consume('g', 'a', 2)");
($allowed, $waited) = split /\|/, $sessions[0]->query(waiting_take('g', 'a', 2, '1 second'));
is($allowed, 't', 'GCRA: a wait is booked');
cmp_ok($waited, '>=', 180, "GCRA: for the two tokens' refill, ~200 ms (waited $waited ms)");

# At the start of a window, so that the wait ends in the next one.
$sessions[0]->query_ok(q{SELECT pg_sleep((2000 - (extract(epoch FROM clock_timestamp()) * 1000)::bigint % 2000) / 1000.0 + 0.05)});
$sessions[0]->query_ok("SELECT rl_consume('fw', 'w', 2)");
($allowed, $waited) = split /\|/, $sessions[0]->query(waiting_take('fw', 'w', 1, '3 seconds'));
is($allowed, 't', 'fixed window: a wait books the next window');
cmp_ok($waited, '>=', 1500, "it waited for the window to end ($waited ms)");
my $next = parse_decision($sessions[0]->query(decision_sql('fw', 'w', 2, 'rl_peek')));
is($next->{allowed}, 'f', 'the next window holds the booking: 2 more do not fit');
is($next->{remaining}, 1, 'the next window has 1 left');
# A booking of the next window, cancelled, goes back there (not to the window it was asked in):
# in 10-second windows, well inside one, the two windows' counts in Redis say where it went
# (not the give-back's mark, which makes it happen once).
$sessions[0]->query_ok(q{SELECT pg_sleep(CASE WHEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint % 10000 > 6000
	THEN (10000 - (extract(epoch FROM clock_timestamp()) * 1000)::bigint % 10000) / 1000.0 + 0.05 ELSE 0 END)});
$sessions[0]->query_ok("SELECT rl_consume('fw10', 'wc', 2)");
$sessions[1]->start_query(waiting_take('fw10', 'wc', 2, '12 seconds'));
usleep(300_000);
my @counts = sort map { $redis->cli('GET', $_) } grep { !/:refund:/ } split /\n/, $redis->cli('--scan', '--pattern', '*{wc}*fw10*');
is("@counts", '2 2', 'fixed window: a booking counts in the next window (2 in each)');
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $sessions[1]->pid . ')');
$sessions[1]->wait_result;
@counts = sort map { $redis->cli('GET', $_) } grep { !/:refund:/ } split /\n/, $redis->cli('--scan', '--pattern', '*{wc}*fw10*');
is("@counts", '2', 'fixed window: a cancelled booking goes back to the next window, not to the one it was asked in');

#
# 6. Redis silent during a call: the fail mode at the deadline, not a wait. A waiter
#    asleep when Redis stops keeps what it booked.
#
$sessions[0]->query_ok("SELECT rl_consume('slow', 'r', 1)");
$sessions[1]->start_query(waiting_take('slow', 'r', 1, '5 seconds'));
usleep(200_000);
$redis->pause;
my ($booked_allowed) = split /\|/, $sessions[1]->wait_result;
is($booked_allowed, 't', 'a waiter asleep while Redis is paused keeps its booked grant');
$sessions[2]->query_ok("SET ratelimit.command_timeout = '300ms'");
$start = time;
my $silent = parse_decision($sessions[2]->query(
	"SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source "
	. "FROM rl_consume('slow', 'r2', 1, max_wait => '5 seconds')"));
my $silent_s = time - $start;
is($silent->{source}, 'fail_closed', 'Redis silent: the fail mode decides');
cmp_ok($silent_s, '<', 1.5, "within the deadline, not max_wait ($silent_s s)");
# A settle Redis cannot answer takes nothing, whatever the fail mode: not all of it was taken.
$sessions[2]->query_ok("SET ratelimit.redis_url = '" . $redis->url . "'");    # a breaker of its own: Redis is asked
is($sessions[2]->query("SELECT allowed, source FROM rl_settle('llm_open', 'silent', 1, 5)"), 'f|fail_closed',
	'Redis silent: a settle up takes nothing (allowed false), even on a policy that fails open');
is($sessions[2]->query("SELECT allowed, source FROM rl_settle('llm_open', 'silent', 5, 1)"), 'f|fail_closed',
	'Redis silent: a settle down gives nothing back (allowed false)');
$sessions[2]->query_ok("RESET ratelimit.redis_url");
$redis->resume;
usleep(300_000);

#
# 7. A lease waits for a release; a wait that ends first is a denial.
#
my $holder = $sessions[3];
$holder->query_ok("BEGIN; SELECT rl_acquire('lease', 'l')");
$sessions[4]->start_query(
	"SELECT allowed, waited_ms FROM rl_acquire('lease', 'l', max_wait => '3 seconds')");
usleep(500_000);
$holder->query_ok('COMMIT');
my ($lease_allowed, $lease_waited) = split /\|/, $sessions[4]->wait_result;
is($lease_allowed, 't', 'a lease waiter gets the lease once it is released');
cmp_ok($lease_waited, '>=', 400, "it waited for the release ($lease_waited ms)");
# Lease waiters are served in arrival order: five queue behind a holder; each keeps its lease
# 100 ms. One that gives up (max_wait) or is cancelled leaves the queue at once.
$holder->query_ok("BEGIN; SELECT rl_acquire('lease', 'fifo')");
# Arrival order: 5, 6, then 10 (gives up after 150 ms) and 11 (cancelled), then 7, 8, 9.
foreach my $i (5, 6, 10, 11, 7, 8, 9)
{
	my $wait = $i == 10 ? '150 ms' : '10 seconds';
	$sessions[$i]->start_query($i >= 10 ? qq{SELECT allowed FROM rl_acquire('lease', 'fifo', max_wait => '$wait')}
		: q{BEGIN; SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint }
		  . q{FROM rl_acquire('lease', 'fifo', max_wait => '10 seconds') WHERE allowed; SELECT pg_sleep(0.1); COMMIT});
	usleep(30_000);
}
usleep(300_000);
is($sessions[10]->wait_result, 'f', 'a lease waiter whose max_wait ends first is denied');
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $sessions[11]->pid . ')');
$sessions[11]->wait_result;
my $released_at = time;
$holder->query_ok('COMMIT');
my @lease_order = map { scalar $sessions[$_]->wait_result } 5 .. 9;
my @lease_times = map { (split /\n/)[0] } @lease_order;
is_deeply([ sort { $a <=> $b } @lease_times ], \@lease_times, "lease waiters are served in arrival order (@lease_times)");
cmp_ok($lease_times[-1] / 1000 - $released_at, '<', 2.0,
	sprintf('the waiters that left (one timed out, one cancelled) hold no one up: the last served %.2f s after the release',
		$lease_times[-1] / 1000 - $released_at));
# A ticket left in the queue without its expiry (one of the two sets lost, as eviction may)
# holds no one: a take that does not wait is not held by it, and a waiter drops it.
$holder->query_ok("SELECT rl_acquire('lease', 'orphan', 'session'); SELECT rl_release('lease', 'orphan')");
my ($lease_key) = grep { !/:queue/ } split /\n/, $redis->cli('--scan', '--pattern', '*{orphan}*');
$redis->cli('ZADD', "$lease_key:queue", 1, 'orphan-ticket');
is((split /\|/, $holder->query("SELECT allowed, source FROM rl_acquire('lease', 'orphan', 'session')"))[0], 't',
	'a ticket without its expiry does not hold a take that does not wait');
$holder->query_ok("SELECT rl_release('lease', 'orphan')");
is($holder->query("SELECT allowed FROM rl_acquire('lease', 'orphan', 'session', max_wait => '1 second')"), 't',
	'nor a waiter');
$holder->query_ok("SELECT rl_release('lease', 'orphan')");
$holder->query_ok("BEGIN; SELECT rl_acquire('lease', 'l2')");
($lease_allowed, $lease_waited) = split /\|/, $sessions[4]->query(
	"SELECT allowed, waited_ms FROM rl_acquire('lease', 'l2', max_wait => '200 ms')");
is($lease_allowed, 'f', 'a lease wait that ends before a release is a denial');
cmp_ok($lease_waited, '>=', 190, "after max_wait ($lease_waited ms)");
$holder->query_ok('COMMIT');

#
# 8. Settle: down gives back, up takes beyond empty (owing at most max_debt); a
#    reservation follows, so a rollback gives back what was really taken.
#
my $s = $sessions[0];
sub llm_remaining { return parse_decision($s->query(decision_sql('llm', $_[0], 1, 'rl_peek')))->{remaining} }
$s->query_ok("BEGIN; SELECT rl_reserve('llm', 'up_commit', 100); SELECT rl_settle('llm', 'up_commit', 100, 300); COMMIT");
is(llm_remaining('up_commit'), 700, 'settled up to 300 and committed: 300 taken');
$s->query_ok("BEGIN; SELECT rl_reserve('llm', 'up_rollback', 100); SELECT rl_settle('llm', 'up_rollback', 100, 300); ROLLBACK");
is(llm_remaining('up_rollback'), 1000, 'settled up to 300 and rolled back: all given back');
$s->query_ok("BEGIN; SELECT rl_reserve('llm', 'down_commit', 100); SELECT rl_settle('llm', 'down_commit', 100, 40); COMMIT");
is(llm_remaining('down_commit'), 960, 'settled down to 40 and committed: 40 taken');
$s->query_ok("BEGIN; SELECT rl_reserve('llm', 'down_rollback', 100); SELECT rl_settle('llm', 'down_rollback', 100, 40); ROLLBACK");
is(llm_remaining('down_rollback'), 1000, 'settled down to 40 and rolled back: all given back');
$s->query_ok("BEGIN; SELECT rl_reserve('llm', 'part_rollback', 1000); SELECT rl_settle('llm', 'part_rollback', 1000, 2000); ROLLBACK");
is(llm_remaining('part_rollback'), 1000, 'settled up beyond max_debt (500 of 1,000 taken) and rolled back: all given back');
# A take (rl_consume) settled up beyond empty: the subject owes, later callers wait it out.
$s->query_ok("SELECT rl_consume('llm', 'debt', 1000)");
my $settle = parse_decision($s->query(
	"SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source "
	. "FROM rl_settle('llm', 'debt', 1000, 1300)"));
is($settle->{allowed}, 't', 'settled up 300 beyond empty: all taken (max_debt 500)');
my $owed = parse_decision($s->query(decision_sql('llm', 'debt', 1, 'rl_peek')));
# 300 owed + 1 for the token: 301 tokens at 3.6 s each.
cmp_ok($owed->{retry_after_ms}, '>=', 300 * 3600, "a later caller waits the debt out ($owed->{retry_after_ms} ms)");
$settle = parse_decision($s->query(
	"SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source "
	. "FROM rl_settle('llm', 'debt', 100, 1000)"));
is($settle->{allowed}, 'f', 'a settle beyond max_debt is not all taken');
$owed = parse_decision($s->query(decision_sql('llm', 'debt', 1, 'rl_peek')));
cmp_ok($owed->{retry_after_ms}, '<=', 501 * 3600, "debt is bounded: at most max_debt owed ($owed->{retry_after_ms} ms)");
cmp_ok($owed->{retry_after_ms}, '>=', 500 * 3600, 'and what fitted within it was taken');
($out, $err) = $s->query("SELECT rl_settle('sw', 'x', 1, 2)");
like($err, qr/0A000|cannot be settled up/, 'a sliding window cannot be settled up: 0A000');
($out, $err) = $s->query("SELECT rl_settle('llm', 'x', 1, -1)");
like($err, qr/22023/, 'a negative actual is refused with 22023');
($out, $err) = $s->query("SELECT rl_settle('llm', 'x', 1, NULL)");
like($err, qr/22004/, 'a NULL actual is refused with 22004');
# A statement trigger charges the rows counted at statement end, not an estimate.
$s->query_ok(q{CREATE TABLE exported (tenant text);
	CREATE TRIGGER charge AFTER INSERT ON exported REFERENCING NEW TABLE AS new_rows
	  FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('llm', 'tenant')});
$s->query_ok(q{INSERT INTO exported SELECT 'rows' FROM generate_series(1, 37)});
is(llm_remaining('rows'), 963, 'a statement trigger charges the 37 rows written');

#
# 9. request_id: a retry takes nothing; a rolled-back reservation forgets its id.
#
sub ids_remaining { return parse_decision($s->query(decision_sql('ids', $_[0], 1, 'rl_peek')))->{remaining} }
my @sources = map { (split /\|/, $s->query("SELECT allowed, source FROM rl_consume('ids', 'one', 2, request_id => 'req-1')"))[1] } 1 .. 3;
is_deeply(\@sources, [qw(redis replay replay)], 'the same request_id three times: one decision, two replays');
is(ids_remaining('one'), 98, 'charged once');
$s->query_ok("SELECT rl_consume('ids', 'one', 2, request_id => 'req-2')");
is(ids_remaining('one'), 96, 'a different id is charged again');
# A 40001-style retry of a whole transaction: the first attempt took, then failed.
$s->query("BEGIN; SELECT rl_consume('ids', 'tx', 5, request_id => 'order-7'); SELECT 1/0; COMMIT");
$s->query_ok("BEGIN; SELECT rl_consume('ids', 'tx', 5, request_id => 'order-7'); COMMIT");
is(ids_remaining('tx'), 95, 'a transaction retried with the same id is charged once');
$s->query_ok("BEGIN; SELECT rl_reserve('ids', 'res', 5, request_id => 'order-8'); ROLLBACK");
is(ids_remaining('res'), 100, 'a rolled-back reservation charges nothing');
my ($res_source) = (split /\|/, $s->query("BEGIN; SELECT allowed, source FROM rl_reserve('ids', 'res', 5, request_id => 'order-8'); COMMIT"))[1];
is($res_source, 'redis', 'and its id is forgotten: the retry is decided, not replayed');
is(ids_remaining('res'), 95, 'charged once in all');
my @many = split /\n/, $s->query(
	"SELECT subject || ':' || source FROM rl_consume_many('ids', ARRAY['m1', 'm1', 'm2'], NULL, ARRAY['a', 'a', 'a'])");
is_deeply(\@many, [qw(m1:redis m1:replay m2:redis)], 'rl_consume_many: per element (an id is per subject)');
my @group = map { scalar $s->query("SELECT string_agg(source, ',') FROM rl_consume_all(ARRAY['ids', 'ids'], ARRAY['grp', 'grp'], ARRAY[1, 2], 'g-1')") } 1 .. 2;
is_deeply(\@group, [ 'redis,redis', 'replay,replay' ], 'rl_consume_all: the group is made once per id');
is(ids_remaining('grp'), 97, 'the group charged once');
$s->query_ok("SELECT rl_consume('short_memory', 'm', 1, request_id => 'r')");
usleep(400_000);
my (undef, $late) = split /\|/, $s->query("SELECT allowed, source FROM rl_consume('short_memory', 'm', 1, request_id => 'r')");
is($late, 'redis', 'after replay_window the same id is a new request');
my @huge = map { scalar $s->query("SELECT source, remaining FROM rl_consume('huge', 'h', 1, request_id => 'big')") } 1 .. 2;
is_deeply(\@huge, [ 'redis|299999999999999', 'replay|299999999999999' ], 'a replay answers numbers past 10^14 exactly');
# A replay during the first asking's wait waits for the same turn; a grant in use by a
# replay is not given back when the first asking is cancelled.
$s->query_ok("SELECT rl_consume('slow', 'rw', 1)");
$sessions[1]->start_query("SELECT allowed, waited_ms FROM rl_consume('slow', 'rw', 1, max_wait => '5 seconds', request_id => 'w1')");
usleep(200_000);
my ($replay_allowed, $replay_waited, $replay_source) = split /\|/, $sessions[2]->query(
	"SELECT allowed, waited_ms, source FROM rl_consume('slow', 'rw', 1, max_wait => '5 seconds', request_id => 'w1')");
is("$replay_allowed/$replay_source", 't/replay', 'a replay during the wait is a replay');
cmp_ok($replay_waited, '>=', 600, "and waits for the booked turn too ($replay_waited ms)");
$sessions[1]->wait_result;
$s->query_ok("SELECT rl_consume('slow', 'rc', 1)");
$sessions[1]->start_query("SELECT allowed FROM rl_consume('slow', 'rc', 1, max_wait => '5 seconds', request_id => 'w2')");
usleep(200_000);
$sessions[2]->start_query("SELECT allowed FROM rl_consume('slow', 'rc', 1, max_wait => '5 seconds', request_id => 'w2')");
usleep(200_000);
$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $sessions[1]->pid . ')');
$sessions[1]->wait_result;
is($sessions[2]->wait_result, 't', 'the replay keeps its grant when the first asking is cancelled');
cmp_ok(parse_decision($s->query(decision_sql('slow', 'rc', 1, 'rl_peek')))->{retry_after_ms}, '>', 0,
	'and the grant in use is not given back');
($out, $err) = $s->query("SELECT rl_consume_many('ids', ARRAY['a', 'b'], NULL, ARRAY['1'])");
like($err, qr/22023/, 'rl_consume_many: request_ids of another length than subjects is refused with 22023');
($out, $err) = $s->query("SELECT rl_consume_many('ids', ARRAY['a', 'b'], NULL, ARRAY['1', NULL])");
like($err, qr/22004/, 'rl_consume_many: a NULL request id is refused with 22004');
($out, $err) = $s->query("SELECT rl_consume('ids', 'x', 1, request_id => repeat('r', 257))");
like($err, qr/22023/, 'a request_id over 256 bytes is refused with 22023');
($out, $err) = $s->query("SELECT rl_settle('llm', 'x', NULL, 1)");
like($err, qr/22004/, 'rl_settle: a NULL cost is refused with 22004');
($out, $err) = $s->query("SELECT rl_settle('lease', 'x', 1, 2)");
like($err, qr/42809/, 'rl_settle: a concurrency policy is refused with 42809');
($out, $err) = $s->query("SELECT rl_consume('ids', 'x', 1, request_id => '')");
like($err, qr/22023/, 'an empty request_id is refused with 22023');
my $keys = $redis->cli('--scan', '--pattern', '*request*');
unlike($keys, qr/req-1|order-7/, 'Redis holds the keyed hash of an id, never the id');

#
# 10. 64 sessions racing with 100 ids on 100 tokens: exactly 100 charged.
#
my $dir = PostgreSQL::Test::Utils::tempdir();
append_to_file("$dir/ids.sql", q{\set id random(1, 100)
INSERT INTO grants SELECT :id, allowed, 0, 0 FROM rl_consume('ids', 'race', 1, request_id => 'id-' || :id) WHERE source = 'redis';
});
run_pgbench($node, 'ids', "$dir/ids.sql", $clients, 60);
is($node->safe_psql('postgres', "SELECT count(*) FROM grants WHERE allowed"), 100,
	'64 racing sessions reusing 100 ids on 100 tokens: exactly 100 charged');
is($node->safe_psql('postgres', "SELECT count(DISTINCT seq) FROM grants"), 100, 'each id once');
is(ids_remaining('race'), 0, 'and the bucket holds exactly 100 fewer');

$_->quit foreach @sessions, $traffic;
done_testing();
