
# The noisy-neighbour suite: one role's own work, however big or slow, never changes what
# another role gets. Each row runs an attack beside two victims, a session deciding on
# another policy and one deciding on a hot subject (with an allowance), and compares them
# with a control run, in which the attacker does the same amount of work touching nothing
# shared (the same batch over other subjects, the same transaction committed instead of
# rolled back, ...). The victims decide exactly as in the control (the same sources and
# answers, the same number of grants where it is fixed), with latency within 2x of the
# control's plus a few ms (two shared cores: CPU contention alone moves latency; what the
# suite measures is what the shared mechanisms add), and the breaker stays closed.
# Every shared mechanism has its row here: the breaker (rollbacks, commits, batches, scripts
# at their bounds, cancel and terminate storms, a slow role), tickets of slices (a batch
# naming a hot subject), the deny cache (crafted collisions; the local buckets' are in t/075),
# and the scripts Redis runs for everyone (the sliding log at its bounds, groups of 32
# checks), waits (a crowd waiting and cancelled; a crowd waiting for a lease; bookings bounded
# per subject), regions (a region whose Redis is silent: its breaker apart from this
# server's; the shares and leases of split policies are in t/220), rl_top's summaries (a
# flood of one-shot subjects, on another policy and on the victim's own), and the shared
# connection (ratelimit.redis_connections = shared: every row runs through it when the
# suite runs with RL_REDIS_CONNECTIONS=shared; one row floods it with small batches).

use strict;
use warnings;

use List::Util qw(max);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

my $redis = redis_start(name => 'noisy');
# A breaker that opened would stay open for retry_interval: the victims go on that long
# after the attack.
my $retry_ms = 500;
# rl_top's summaries cover the whole run: its rows compare with rl_stats.
my $node = rl_node('noisy', redis => $redis, max_connections => 60,
	conf => ["ratelimit.retry_interval = '${retry_ms}ms'", "ratelimit.top_period = '1h'"]);

$node->safe_psql('postgres', q{
	SELECT rl_define('nn.victim', 1000000, per => '1 hour');
	-- A small allowance: the hot victim's slice is spent and fetched again many times a second.
	SELECT rl_define('nn.hot', 1000000, per => '1 hour', allowance => 20);
	-- The attacker's: a token a day per subject, so that what was not given back shows.
	SELECT rl_define('nn.att', 10000, per => '10000 days');
	SELECT rl_define('nn.ctl', 10000, per => '10000 days');
	SELECT rl_define('nn.log', 10000, per => '1 day', algorithm => 'sliding_log');
	SELECT rl_define('nn.small', 2, per => '1 hour');
	-- Waits: a crowd paced at 1 per 10 ms (bookings up to 1,000 ahead), and a policy shared
	-- with a victim whose bookings are bounded by its default max_debt (its capacity).
	SELECT rl_define('nn.pace', 100, per => '1 second', burst => 1, max_debt => 1000);
	SELECT rl_define('nn.shared', 10, per => '1 second');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('nn.lease', 'concurrency', 1000000, '1 hour');
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('nn.lease1', 'concurrency', 1, '1 hour');
	CREATE TABLE nn_done (run text PRIMARY KEY, at timestamptz NOT NULL);
	-- A victim: decisions one after the other (2 ms apart) until 0.6 s after the attack
	-- ended (past the breaker's retry_interval, so that a breaker it opened is seen); what
	-- it got, as 'source/allowed=count' sorted, and its latency's median, 95th percentile and
	-- mean (a few long stalls show in the mean).
	CREATE FUNCTION nn_victim(p text, s text, run text) RETURNS text LANGUAGE plpgsql AS $$
	DECLARE
		t0 timestamptz;
		d rl_decision;
		lat float8[] := '{}';
		kinds text[] := '{}';
		done_at timestamptz;
	BEGIN
		LOOP
			t0 := clock_timestamp();
			SELECT * INTO d FROM rl_consume(p, s);
			lat := lat || extract(epoch FROM clock_timestamp() - t0) * 1000;
			kinds := kinds || (d.source || '/' || d.allowed);
			SELECT at INTO done_at FROM nn_done WHERE nn_done.run = nn_victim.run;
			EXIT WHEN done_at IS NOT NULL AND clock_timestamp() > done_at + interval '0.6 s';
			PERFORM pg_sleep(0.002);
		END LOOP;
		RETURN (SELECT string_agg(k || '=' || c, ',' ORDER BY k)
		        FROM (SELECT k, count(*) AS c FROM unnest(kinds) k GROUP BY k) g)
		    || '|' || (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l) FROM unnest(lat) l)
		    || '|' || (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY l) FROM unnest(lat) l)
		    || '|' || (SELECT avg(l) FROM unnest(lat) l);
	END $$;
	CREATE TABLE nn_rows (tenant text);
	CREATE TABLE nn_rows_ctl (tenant text);
	CREATE TRIGGER charge AFTER INSERT ON nn_rows REFERENCING NEW TABLE AS new_rows
		FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('nn.att', 'tenant');
	CREATE TRIGGER charge AFTER INSERT ON nn_rows_ctl REFERENCING NEW TABLE AS new_rows
		FOR EACH STATEMENT EXECUTE FUNCTION rl_limit_trigger('nn.ctl', 'tenant');
	CREATE ROLE attacker LOGIN;
	GRANT EXECUTE ON FUNCTION rl_consume(text, text, bigint, interval, text), rl_reserve(text, text, bigint, interval, text),
		rl_acquire(text, text, text, interval), rl_consume_many(text, text[], bigint[], text[]),
		rl_consume_all(text[], text[], bigint[], text), rl_refund(text, text, bigint) TO attacker;
	GRANT INSERT ON nn_rows, nn_rows_ctl, nn_done TO attacker;
});

my $runs = 0;

# Runs attack (SQL for the attacker's session, a role with only the manual's grants) beside
# the two victims; returns their summaries { other => [kinds, median, p95], hot => [...] }.
# setup: SQL every session runs first (superuser settings are set as the superuser).
sub run_beside
{
	my ($attack, %opt) = @_;
	my $run = 'run' . ++$runs;
	my %victim = (other => [ 'nn.victim', 'v_other' ], hot => [ 'nn.hot', 'hot_1' ]);
	my %sessions = map { $_ => session($node) } keys %victim;
	foreach my $name (keys %victim)
	{
		$sessions{$name}->query_ok($opt{setup}) if $opt{setup};
		$sessions{$name}->start_query(sprintf("SELECT nn_victim('%s', '%s', '%s')", @{ $victim{$name} }, $run));
	}
	my $attacker = session($node, user => $opt{as} // 'attacker');
	$attacker->query_ok($opt{setup}) if $opt{setup} && $opt{as};
	usleep(100_000);    # the victims have begun
	$attacker->start_query($attack);
	$opt{during}->() if $opt{during};
	my ($out, $err) = $attacker->wait_result(300);
	$node->safe_psql('postgres', "INSERT INTO nn_done VALUES ('$run', clock_timestamp())");
	my %result;
	foreach my $name (keys %victim)
	{
		my ($summary) = $sessions{$name}->wait_result(120);
		my ($kinds, $median, $p95, $mean) = split /\|/, $summary // '';
		$result{$name} = [ $kinds // '', $median // 1e9, $p95 // 1e9, $mean // 1e9 ];
		$sessions{$name}->quit;
	}
	$attacker->quit;
	$result{attack_err} = $err;
	return \%result;
}

# The kinds of answers, without their counts: 'redis/t' (a victim's counts follow the time it ran).
sub kinds_of
{
	my ($kinds) = @_;
	return join ',', map { (split /=/)[0] } split /,/, $kinds;
}

# Runs a row: control and attack, then compares the victims.
sub row
{
	my ($name, $control, $attack, %opt) = @_;
	my $started = time;
	my $ctl = run_beside($control, %opt);
	my $middle = time;
	my $att = run_beside($attack, %opt);
	note sprintf('%s: control %.1f s, attack %.1f s', $name, $middle - $started, time - $middle);
	foreach my $victim (qw(other hot))
	{
		my ($ck, $cm, $c95, $cmean) = @{ $ctl->{$victim} };
		my ($ak, $am, $a95, $amean) = @{ $att->{$victim} };
		note sprintf('%s: %s victim: control %s, median %.2f ms, p95 %.2f ms, mean %.2f ms; '
			  . 'attack %s, median %.2f ms, p95 %.2f ms, mean %.2f ms',
			$name, $victim, $ck, $cm, $c95, $cmean, $ak, $am, $a95, $amean);
		is(kinds_of($ak), kinds_of($ck), "$name: the $victim victim decides as in the control ("
			  . kinds_of($ck) . ')');
		cmp_ok($am, '<=', 2 * $cm + 5, "$name: the $victim victim's median latency within 2x + 5 ms of the control's");
		cmp_ok($a95, '<=', 2 * $c95 + 20, "$name: the $victim victim's 95th percentile within 2x + 20 ms of the control's");
		cmp_ok($amean, '<=', 2 * $cmean + 5, "$name: the $victim victim's mean latency within 2x + 5 ms of the control's");
	}
	my ($breaker) = $node->safe_psql('postgres', 'SELECT breaker FROM rl_health()');
	is($breaker, 'closed', "$name: the breaker is closed");
	return ($ctl, $att);
}

# A statement over n subjects named prefix || g.
sub subjects_sql { my ($prefix, $n) = @_; return "ARRAY(SELECT '$prefix' || g FROM generate_series(1, $n) g)" }

###
### The breaker: a rollback of 30,000 reservations (their refunds in one pipeline) with
### default settings: every refund done, no one else's decision to the fail mode.
###
row('rollback of 30,000 reservations',
	q{BEGIN; SELECT count(*) FROM generate_series(1, 30000) g, LATERAL rl_reserve('nn.ctl', 'rc' || g) r; COMMIT;},
	q{BEGIN; SELECT count(*) FROM generate_series(1, 30000) g, LATERAL rl_reserve('nn.att', 'ra' || g) r; ROLLBACK;});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM generate_series(1, 30000) g, LATERAL rl_peek('nn.att', 'ra' || g) p WHERE p.remaining = p.capacity}),
	'30000', 'rollback of 30,000 reservations: every one refunded');

###
### Leases: 10,000 transaction-scope leases released at COMMIT.
###
row('commit releasing 10,000 leases',
	q{SELECT count(*) FROM generate_series(1, 10000) g, LATERAL rl_consume('nn.ctl', 'lc' || g) r;},
	q{BEGIN; SELECT count(*) FROM generate_series(1, 10000) g, LATERAL rl_acquire('nn.lease', 'la' || g, 'transaction') r; COMMIT;});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM generate_series(1, 10000) g, LATERAL rl_peek('nn.lease', 'la' || g) p WHERE p.remaining = p.capacity}),
	'10000', 'commit releasing 10,000 leases: every one released');

###
### Tickets: a batch of 100,000 that names the hot subject 40 times first holds no fetch of
### its slice; the victim on that subject is not held up.
###
row('a 100,000-element batch naming the hot subject first',
	'SELECT count(*) FROM rl_consume_many(\'nn.hot\', ' . subjects_sql('bc', 100000) . ')',
	'SELECT count(*) FROM rl_consume_many(\'nn.hot\', array_fill(\'hot_1\'::text, ARRAY[40]) || '
	  . subjects_sql('ba', 99960) . ')');

###
### A statement trigger over 100,000 rows, rolled back: 100,000 charges in one batch, and as
### many refunds at the rollback.
###
row('a statement trigger over 100,000 rows, rolled back',
	q{BEGIN; INSERT INTO nn_rows_ctl SELECT 'tc' || g FROM generate_series(1, 100000) g; COMMIT;},
	q{BEGIN; INSERT INTO nn_rows SELECT 'ta' || g FROM generate_series(1, 100000) g; ROLLBACK;});
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM generate_series(1, 100000, 10) g, LATERAL rl_peek('nn.att', 'ta' || g) p WHERE p.remaining = p.capacity}),
	'10000', 'a statement trigger over 100,000 rows, rolled back: every one refunded (1 in 10 looked at)');

###
### The scripts Redis runs for everyone, at their bounds: a sliding log of capacity 10,000
### taken 40 times 3,990 in one batch and then filled by cost-1 takes, refunds of 3,333,
### and groups of 32 checks; the control runs as many lean token-bucket takes.
###
row('the sliding log at its bounds',
	'SELECT count(*) FROM rl_consume_many(\'nn.ctl\', ' . subjects_sql('lc', 40) . ', array_fill(3990::bigint, ARRAY[40]));'
	  . q{ SELECT allowed FROM rl_consume('nn.ctl', 'lc_full', 10000);}
	  . q{ SELECT count(*) FROM generate_series(1, 900) g, LATERAL rl_consume('nn.ctl', 'lc_full') r;}
	  . q{ SELECT count(*) FROM generate_series(1, 20) g, LATERAL rl_consume('nn.ctl', 'lc_ref' || g, 5000) r;},
	'SELECT count(*) FROM rl_consume_many(\'nn.log\', ' . subjects_sql('la', 40) . ', array_fill(3990::bigint, ARRAY[40]));'
	  . q{ SELECT allowed FROM rl_consume('nn.log', 'la_full', 10000);}
	  . q{ SELECT count(*) FROM generate_series(1, 900) g, LATERAL rl_consume('nn.log', 'la_full') r;}
	  . q{ SELECT count(*) FROM generate_series(1, 20) g, LATERAL rl_consume('nn.log', 'la_ref' || g, 5000) r,}
	  . q{ LATERAL rl_refund('nn.log', 'la_ref' || g, 3333) f;});
row('groups of 32 checks',
	q{SELECT count(*) FROM generate_series(1, 6400) g, LATERAL rl_consume('nn.ctl', 'gc' || g) r;},
	q{SELECT count(*) FROM generate_series(1, 200) g, LATERAL rl_consume_all(array_fill('nn.log'::text, ARRAY[32]), }
	  . q{ARRAY(SELECT 'ga' || g || '/' || k FROM generate_series(1, 32) k), array_fill(100::bigint, ARRAY[32])) r;});

###
### A role's own short deadline: its calls fail (its fail mode), no one else's.
###
row('a role with a 1 ms command_timeout',
	q{SELECT count(*) FROM generate_series(1, 1000) g, LATERAL rl_consume('nn.ctl', 'sc' || (g % 100)) r;},
	q{SET ratelimit.command_timeout = '1ms'; SELECT count(*) FROM generate_series(1, 1000) g, LATERAL rl_consume('nn.att', 'sa' || (g % 100)) r;});

###
### Cancel and terminate storms: batches cancelled and backends terminated mid-call, again
### and again; the control runs the same batches to the end.
###
my $storm_batch = 'SELECT count(*) FROM rl_consume_many(\'nn.att\', ' . subjects_sql('cs', 20000) . ')';
{
	my @storm = map { session($node, user => 'attacker') } 1 .. 3;
	my $cancels = 0;
	my $storm = sub {
		# Three sessions start big batches; each is cancelled or terminated after 40 ms.
		for my $round (1 .. 6)
		{
			my @victims = map { session($node, user => 'attacker') } 1 .. 2;
			$_->start_query("BEGIN; SELECT count(*) FROM generate_series(1, 5000) g, LATERAL rl_reserve('nn.att', 'ts' || g) r; $storm_batch; ROLLBACK")
			  for @victims;
			usleep(40_000 + 30_000 * ($round % 3));
			$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $victims[0]->pid . ')');
			$node->safe_psql('postgres', 'SELECT pg_terminate_backend(' . $victims[1]->pid . ')');
			$cancels++;
			$_->quit for @victims;
		}
	};
	row('cancel and terminate storms', $storm_batch, $storm_batch, during => $storm);
	$_->quit for @storm;
	note "cancel and terminate storms: $cancels rounds of a cancel and a terminate";
}

###
### Waits: a crowd of six sessions booking and sleeping on their own policy (240 waits in a
### queue 10 ms apart), two of them cancelled mid-wait (their bookings given back); the
### control sleeps as long between plain takes of its own policy.
###
{
	my $crowd_sql = q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL rl_consume('nn.pace', 'crowd', 1, max_wait => '10 seconds') r WHERE r.allowed};
	my $during = sub {
		my @crowd = map { session($node, user => 'attacker') } 1 .. 5;
		$_->start_query($crowd_sql) for @crowd;
		usleep(500_000);
		$node->safe_psql('postgres', 'SELECT pg_cancel_backend(' . $_->pid . ')') for @crowd[ 0, 1 ];
		$_->wait_result(60) for @crowd;
		$_->quit for @crowd;
	};
	my ($ctl, $att) = row('a waiting crowd, cancelled in part',
		q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL (SELECT rl_consume('nn.ctl', 'wc' || g), pg_sleep(0.06)) r},
		$crowd_sql, during => $during);
	unlike($att->{attack_err} // '', qr/ERROR/, 'a waiting crowd: every wait of the attacker granted, none failed');
}

###
### Lease waiters: eight sessions queue for a lease held 2.5 s, looking again every 10 to
### 100 ms until their max_wait (2 s) ends; the control sleeps as long.
###
{
	my @got;
	my $during = sub {
		my @crowd = map { session($node, user => 'attacker') } 1 .. 8;
		$_->start_query(q{SELECT allowed FROM rl_acquire('nn.lease1', 'held', max_wait => '2 seconds')}) for @crowd;
		@got = map { scalar $_->wait_result(60) } @crowd;
		$_->quit for @crowd;
	};
	row('a crowd waiting for a lease',
		q{SELECT pg_sleep(2.5)},
		q{BEGIN; SELECT rl_acquire('nn.lease1', 'held'); SELECT pg_sleep(2.5); COMMIT}, during => $during);
	is(join(',', @got), join(',', ('f') x 8), 'a crowd waiting for a lease: every wait ends at its max_wait, denied');
}

###
### Bookings are bounded per subject: a role whose 24 sessions each book a wait of up to a
### day on a subject others use books at most max_debt ahead (the capacity: 10 tokens, 1 s).
###
{
	my @crowd = map { session($node, user => 'attacker') } 1 .. 24;
	$_->query_ok('SELECT 1') for @crowd;
	$_->start_query(q{SELECT count(*) FILTER (WHERE r.allowed) FROM }
		  . q{rl_consume('nn.shared', 'everyone', 1, max_wait => '1 day') r}) for @crowd;
	# Until the crowd has booked as far as it may (10 tokens owed: 1 s), at most 10 s.
	my $owed_ms = 0;
	my $until = time + 10;
	while ($owed_ms < 900 && time < $until)
	{
		usleep(20_000);
		($owed_ms) = $node->safe_psql('postgres', q{SELECT retry_after_ms FROM rl_peek('nn.shared', 'everyone')});
	}
	my $victim = session($node);
	my ($allowed, $waited, $retry) = split /\|/, $victim->query(
		q{SELECT allowed, waited_ms, retry_after_ms FROM rl_consume('nn.shared', 'everyone', 1, max_wait => '1 day')});
	my $granted = 0;
	$granted += $_->wait_result(60) for @crowd;
	note "bookings bounded: the subject owed $owed_ms ms; the crowd was granted $granted of 24; "
	  . "the victim: allowed $allowed, waited $waited ms, retry after $retry ms";
	cmp_ok($owed_ms, '>=', 900, "bookings bounded: the crowd booked as far ahead as it may ($owed_ms ms)");
	cmp_ok($owed_ms, '<=', 1200, "bookings bounded: and no further than max_debt ($owed_ms ms, not a day)");
	cmp_ok($granted, '<=', 10 + 10 + 3, 'bookings bounded: the crowd gets the capacity and the debt (and what refills meanwhile), not 24');
	cmp_ok($allowed eq 't' ? $waited : $retry, '<=', 2500,
		'bookings bounded: a victim on the same subject is served (or told to retry) within (capacity + max_debt) / rate');
	$_->quit for @crowd, $victim;
}

###
### Crafted collisions: with the hash that places subjects cut to 2 bits, a quarter of all
### subjects share each slot's place; the attacker's denials are remembered there, and the
### victim, on the same small policy, is still granted its own 2 tokens, by Redis.
###
{
	my $bits = q{SET ratelimit.test_local_key_bits = 2};
	my $victim = session($node);
	$victim->query_ok($bits);
	my $attacker = session($node);
	$attacker->query_ok($bits);
	# Forty subjects denied (each exhausted, then denied again: remembered; they evict each
	# other from the few places they share, the last one stays).
	$attacker->query_ok(q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL rl_consume('nn.small', 'crafted' || g, 2) r});
	$attacker->query_ok(q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL rl_consume('nn.small', 'crafted' || g, 1) r});
	is($attacker->query_ok(q{SELECT source FROM rl_consume('nn.small', 'crafted40')}), 'deny_cache',
		'crafted collisions: the attacker\'s denials are remembered');
	my @got = map { $victim->consume('nn.small', 'collided_victim') } 1 .. 3;
	is_deeply([ map { "$_->{source}/$_->{allowed}" } @got ], [ 'redis/t', 'redis/t', 'redis/f' ],
		'crafted collisions: the victim gets its own 2 tokens from Redis, then its own denial');
	$_->quit for $victim, $attacker;
}

###
### Regions (0.11.0): a role deciding on a policy homed in a region whose Redis is silent
### (paused) times out there, and that region's breaker opens; the victims, on this server's
### own Redis, decide as in the control, in which the same role decides on a policy homed
### in a region whose Redis answers, and this server's breaker stays closed.
###
{
	my $silent = redis_start(name => 'noisy_far_silent');
	my $answering = redis_start(name => 'noisy_far');
	$node->safe_psql('postgres', sprintf(q{
		ALTER SYSTEM SET ratelimit.region = 'here';
		ALTER SYSTEM SET ratelimit.regions = 'here=%s far=%s silent=%s';
		SELECT pg_reload_conf();
		INSERT INTO rl_policy (name, algorithm, capacity, refill_period, region_mode, home_region)
		VALUES ('nn.far', 'fixed_window', 1000000, '1 hour', 'home', 'far'),
		       ('nn.silent', 'fixed_window', 1000000, '1 hour', 'home', 'silent');
	}, $redis->url, $answering->url, $silent->url));
	$silent->pause;
	row('a role deciding in a region whose Redis is silent',
		q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL rl_consume('nn.far', 'rg' || g) r;},
		q{SELECT count(*) FROM generate_series(1, 40) g, LATERAL rl_consume('nn.silent', 'rg' || g) r;});
	like($node->safe_psql('postgres', 'SELECT string_agg(source, \',\') FROM rl_consume(\'nn.silent\', \'probe\')'),
		qr/^fail_closed$/, 'regions: the silent region\'s own breaker decides its policy by the fail mode');
	$silent->resume;
	$node->safe_psql('postgres', q{
		ALTER SYSTEM RESET ratelimit.region;
		ALTER SYSTEM RESET ratelimit.regions;
		SELECT pg_reload_conf();
	});
}

###
### rl_top's summaries (0.12.0): a flood of 100,000 one-shot subjects on another policy (the
### control: as many takes of one subject) leaves the victim's summary as it was: its subject
### first, counted exactly (every token rl_stats counted, error 0). Then a flood on the
### victim's own policy may raise the bound (total / ratelimit.top_size) but hides no subject
### weighing more.
###
{
	my $size = $node->safe_psql('postgres', 'SHOW ratelimit.top_size');
	row('a flood of 100,000 one-shot subjects (rl_top)',
		q{SELECT count(*) FROM rl_consume_many('nn.att', array_fill('tf_one'::text, ARRAY[100000]));},
		'SELECT count(*) FROM rl_consume_many(\'nn.att\', ' . subjects_sql('tf', 100000) . ');');
	my $tokens = $node->safe_psql('postgres', q{SELECT tokens_granted FROM rl_stats WHERE policy = 'nn.victim'});
	is($node->safe_psql('postgres', q{SELECT subject || ' ' || count || ' ' || error FROM rl_top('nn.victim') WHERE kind = 'taken' AND rank = 1}),
		"v_other $tokens 0", "rl_top: the victim's subject first, all its $tokens tokens, error 0");
	$node->safe_psql('postgres', 'SELECT count(*) FROM rl_consume_many(\'nn.victim\', ' . subjects_sql('vf', 100000) . ')');
	my ($count, $error, $total) = split /\|/, $node->safe_psql('postgres',
		q{SELECT count, error, total FROM rl_top('nn.victim') WHERE kind = 'taken' AND subject = 'v_other'});
	($total) = $node->safe_psql('postgres', q{SELECT DISTINCT total FROM rl_top('nn.victim') WHERE kind = 'taken'});
	note "rl_top after a flood on the victim's policy: v_other's $tokens tokens counted " . ($count // 'missing')
	  . ' (error ' . ($error // '-') . "), total $total, bound " . int($total / $size);
	ok(defined $count ? $count - $error <= $tokens && $tokens <= $count : $tokens <= $total / $size,
		'rl_top: a flood on the victim\'s own policy hides its subject only below the stated bound');
}

###
### The shared connection (0.13.0; run with RL_REDIS_CONNECTIONS=shared, as dev/run-tests
### tap-shared and CI do, where every row above goes through it too): 600 batches of 50
### calls, each small enough to be handed to the server's one connection to Redis, so that
### the victims' calls ride in the same pipelines; the control makes as many calls in 30
### batches of 1,000, each too large to hand off (the backend's own connection).
###
row('600 batches through the shared connection',
	q{SELECT sum(c) FROM generate_series(1, 30) b, LATERAL (SELECT count(*) c FROM rl_consume_many('nn.ctl', ARRAY(SELECT 'pc' || b || '_' || g FROM generate_series(1, 1000) g))) x;},
	q{SELECT sum(c) FROM generate_series(1, 600) b, LATERAL (SELECT count(*) c FROM rl_consume_many('nn.att', ARRAY(SELECT 'pa' || b || '_' || g FROM generate_series(1, 50) g))) x;});

is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time() = pg_postmaster_start_time()'), 't',
	'the server is up');
done_testing();
