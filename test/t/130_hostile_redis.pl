
# A hostile or restricted Redis: replies that claim to be huge or never end,
# scripts that fail halfway, ACLs, and the log under a Redis that fails every
# other call.
#
#  (3)  Hostile replies (fake servers): a reply that claims billions of
#       elements or a gigabyte is refused as soon as its header is read,
#       quickly and without memory, and a reply that trickles forever can be
#       cancelled.
#  (8)  Scripts that fail halfway keep nothing: a command the ACL refuses
#       (PEXPIRE, SET) or OOM is found before the first write; an error reply
#       after an acquire that may have run keeps the lease listed, released
#       at commit.
#  (10) ACL: the minimal ACL for users works for every function,
#       a missing EVALSHA is named as a permission, and so is a refund Redis
#       refused.
#  (11) Log floods: a Redis that fails every other call writes at most a line
#       per class and retry_interval, not one per call.
#
# Subjects never reach the log (checked at the end), nor this test's output.

use strict;
use warnings;

use IO::Socket::INET;
use POSIX ();
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use RateLimitTest;

# The commands our scripts need, as ACL rules; PEXPIRE and SELECT are added
# where a user needs them.
my @script_commands = map { "+$_" } qw(evalsha eval time get set hmget del zcount
  zscore zrem zremrangebyscore zadd zrange zrangebyscore zrevrangebyscore);
my @without_set = grep { $_ ne '+set' } @script_commands;
my @without_evalsha = grep { $_ ne '+evalsha' } @script_commands;
my $user_pw = 'pw-130-Zq8';
my $admin_pw = 'adminpw-130-Lk2';

my $redis = redis_start(
	name => 'hostile_redis',
	acl => [
		[ 'admin', 'on', ">$admin_pw", '~*', '&*', '+@all' ],
		# (8a) everything but PEXPIRE, database 0 (no SELECT).
		[ 'rl', 'on', ">$user_pw", '~rl:*', @script_commands ],
		# (8b) no SET.
		[ 'noset', 'on', ">$user_pw", '~rl:*', @without_set, '+pexpire' ],
		# (10a) the minimal ACL for users, with database 3.
		[ 'ratelimit', 'on', ">$user_pw", '~rl:*', @script_commands, '+pexpire', '+select' ],
		# (10b) no EVALSHA.
		[ 'nosha', 'on', ">$user_pw", '~rl:*', @without_evalsha, '+pexpire', '+select' ],
	]);
my $db = 3;
my $server_url = $redis->url(userinfo => "ratelimit:$user_pw", db => $db);
my %url = (
	rl => $redis->url(userinfo => "rl:$user_pw"),
	noset => $redis->url(userinfo => "noset:$user_pw"),
	nosha => $redis->url(userinfo => "nosha:$user_pw", db => $db),
	admin => $redis->url(userinfo => "admin:$admin_pw"),
);

my $retry_s = 1;
my $timeout_ms = 250;
my $node = rl_node(
	'hostile_redis',
	url => $server_url,
	conf => [
		# Superuser-only: (11) counts lines per retry_interval.
		"ratelimit.retry_interval = '${retry_s}s'",
		"ratelimit.command_timeout = '${timeout_ms}ms'",
	]);
$node->safe_psql(
	'postgres', q{
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode) VALUES
	  ('h.closed', 1000, 1000, '1 day', 'closed'),
	  ('h.open', 1000, 1000, '1 day', 'open'),
	  ('tb.tenant', 1000, 1000, '1 day', 'closed'),
	  ('tb.user', 1000, 1000, '1 day', 'closed');
	INSERT INTO rl_policy (name, capacity, refill_amount, refill_period, fail_mode, allowance) VALUES
	  ('h.allowance', 1000, 1000, '1 day', 'closed', 10);
	INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl, fail_mode) VALUES
	  ('c.closed', 'concurrency', 3, '1 min', 'closed');
});

# Subjects: never in the log, never printed (test names say what they are for).
my %subject = map { $_ => "subj130_$_" } qw(warm hostile trickle ttl noset lease oom
  bucket flood fake a r l minimal nosha refund slice);
my @all_subjects = (values %subject, 'acme', 'acme/bob');

# Whether decision d is the fail mode of policy, without error.
sub is_fail_mode
{
	my ($d, $policy, $name) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	my $want = $policy =~ /open/ ? [ 't', 'fail_open' ] : [ 'f', 'fail_closed' ];
	is_deeply([ @$d{qw(allowed source stderr)} ], [ @$want, '' ],
		"$name: $policy decided by its fail mode ($want->[1]), no error")
	  or diag explain $d;
}

# allowed|remaining|source of rl_acquire (or rl_peek when scope is 'peek') in session s.
sub lease_sql
{
	my ($policy, $subject, $scope) = @_;
	return sprintf('SELECT allowed, remaining, source FROM rl_peek(%s, %s)',
		quote_literal($policy), quote_literal($subject))
	  if defined $scope && $scope eq 'peek';
	return sprintf('SELECT allowed, remaining, source FROM rl_acquire(%s, %s, %s)',
		quote_literal($policy), quote_literal($subject), quote_literal($scope // 'transaction'));
}

# The lines of the log after offset written by backend pid.
sub pid_lines
{
	my ($offset, $pid) = @_;
	return grep { /\[$pid\]/ } split /\n/, log_since($node, $offset);
}

# Keys of database d whose name contains text.
sub keys_with
{
	my ($d, $text) = @_;
	return grep { index($_, $text) >= 0 } $redis->scan_keys($d);
}

sub set_url
{
	my ($s, $url) = @_;
	$s->query_ok('SET ratelimit.redis_url = ' . quote_literal($url));
}

my $log_start = log_offset($node);

###
### (3) Hostile replies.
###

# A session warmed up on the real Redis (policy cache loaded), then pointed at
# a fake: a URL of its own, so a breaker of its own.
my $h = session($node);
is($h->consume('h.closed', $subject{warm})->{source}, 'redis', '(3) warm-up: Redis decides');
$h->query_ok("SET ratelimit.command_timeout = '${timeout_ms}ms'");

# (3a) "*2147483647\r\n" seven times: an array of 2^31-1 elements, claimed
# seven levels deep. Refused at its first header.
{
	my $bytes = "*2147483647\r\n" x 7;
	my $fake = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? $bytes : "-ERR unexpected\r\n" });
	set_url($h, $fake->url);
	my ($elapsed, $d) = timed(sub { $h->consume('h.closed', $subject{hostile}) });
	note sprintf('(3a) %d bytes of *2147483647: fail mode after %.1f ms', length $bytes,
		$elapsed * 1000);
	is_fail_mode($d, 'h.closed', '(3a) *2147483647 x 7');
	cmp_ok($elapsed * 1000, '<', $timeout_ms + 100,
		"(3a) within command_timeout + 100 ms ($timeout_ms + 100)");
	is($h->query('SELECT 1'), '1', '(3a) the backend is still usable');
	is(health($h)->{last_error}, 'protocol: reply too large',
		"(3a) rl_health().last_error: 'protocol: reply too large'");
	$fake->stop;
}

# (3a0) A "sentinel" that answers :1 to everything:
# no array where one is due is refused (class sentinel), never read as one.
{
	my $fake = fake_redis_start(reply => ":1\r\n");
	set_url($h, 'redis-sentinel://127.0.0.1:' . $fake->port . '/mymaster');
	is_fail_mode($h->consume('h.closed', $subject{hostile}), 'h.closed', '(3a0) a sentinel that answers :1');
	like(health($h)->{last_error} // '', qr/^sentinel: /, '(3a0) counted as no sentinel naming the master');
	is($h->query('SELECT 1'), '1', '(3a0) the backend is still usable');
	$fake->stop;
}

# (3w) Replies no Redis sends to the scripts of 0.10.0: a booking longer than the wait
# asked for (a day), a replay mark that is not 0 or 1, a settle that took more than its
# cost. Each is a protocol failure: the fail mode, at once (no sleep), never a grant.
foreach my $case (
	[ 'a booking longer than max_wait', "*5\r\n:1\r\n:0\r\n:0\r\n:0\r\n:86400000\r\n",
		"SELECT allowed, source FROM rl_consume('h.closed', 'w1', 1, max_wait => '1 second')" ],
	[ 'a replay mark of 7', "*6\r\n:1\r\n:0\r\n:0\r\n:0\r\n:0\r\n:7\r\n",
		"SELECT allowed, source FROM rl_consume('h.closed', 'w2', 1, request_id => 'r')" ],
	[ 'a settle that took more than its cost', "*4\r\n:999\r\n:0\r\n:0\r\n:0\r\n",
		"SELECT allowed, source FROM rl_settle('h.closed', 'w3', 1, 6)" ])
{
	my ($name, $bytes, $sql) = @$case;
	my $fake = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? $bytes : "-ERR unexpected\r\n" });
	set_url($h, $fake->url);
	my $protocol_sql = q{SELECT coalesce((redis_errors->>'protocol')::int, 0) FROM rl_stats WHERE policy = 'h.closed'};
	my $before = $node->safe_psql('postgres', $protocol_sql);
	my ($elapsed, $answer) = timed(sub { scalar $h->query($sql) });
	is($answer, 'f|fail_closed', "(3w) $name: the fail mode decides");
	cmp_ok($elapsed, '<', 1, sprintf('(3w) %s: at once (%.2f s), no sleep', $name, $elapsed));
	is($node->safe_psql('postgres', $protocol_sql), $before + 1, "(3w) $name: counted as a protocol failure");
	$fake->stop;
}

# (3y) A reply no Redis sends to a window with rollover (0.12.0): a limit past twice the
# capacity (what it carries is at most the capacity), or below it. The fail mode decides,
# never a grant and never that limit told to a client.
{
	$node->safe_psql('postgres', q{
		INSERT INTO rl_policy (name, algorithm, capacity, refill_period, rollover)
		VALUES ('h.roll', 'fixed_window', 10, '1 hour', 5);
	});
	foreach my $case ([ 'a limit of 1000 for a capacity of 10', "*5\r\n:1\r\n:0\r\n:0\r\n:0\r\n:1000\r\n" ],
		[ 'a limit below the capacity', "*5\r\n:1\r\n:0\r\n:0\r\n:0\r\n:3\r\n" ])
	{
		my ($name, $bytes) = @$case;
		my $fake = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? $bytes : "-ERR unexpected\r\n" });
		set_url($h, $fake->url);
		is($h->query(q{SELECT allowed, source, capacity FROM rl_consume('h.roll', 'ry')}), 'f|fail_closed|10',
			"(3y) $name: the fail mode decides, with the policy's capacity");
		$fake->stop;
	}
	$node->safe_psql('postgres', q{DELETE FROM rl_policy WHERE name = 'h.roll'});
}

# (3x) Replies no Redis sends to the scripts of 0.11.0's regions: a split policy's share
# that says "short" with a mark of 7, or a negative count leased; a home region's lease of
# more tokens than its rest holds. Each is a protocol failure decided by the fail mode,
# never a grant. The home region is a fake too (ratelimit.regions, for a while).
{
	my $home = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? "*4\r\n:1000000\r\n:0\r\n:0\r\n:1000\r\n" : "-ERR unexpected\r\n" });
	$node->safe_psql('postgres', sprintf(q{
		ALTER SYSTEM SET ratelimit.region = 'here';
		ALTER SYSTEM SET ratelimit.regions = 'home=%s';
		SELECT pg_reload_conf();
		INSERT INTO rl_policy (name, algorithm, capacity, refill_period, region_mode, home_region)
		VALUES ('h.split', 'fixed_window', 10, '1 hour', 'split', 'home');
	}, $home->url));
	my $r = session($node);
	foreach my $case (
		[ 'a share with a short mark of 7', "*6\r\n:0\r\n:0\r\n:0\r\n:0\r\n:7\r\n:0\r\n" ],
		[ 'a share with a negative lease', "*6\r\n:0\r\n:0\r\n:0\r\n:0\r\n:1\r\n:-5\r\n" ],
		[ 'a lease of a million from a rest of 10', "*6\r\n:0\r\n:0\r\n:0\r\n:1000\r\n:1\r\n:0\r\n" ])
	{
		my ($name, $bytes) = @$case;
		my $fake = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? $bytes : "-ERR unexpected\r\n" });
		set_url($r, $fake->url);
		is($r->query(q{SELECT allowed, source FROM rl_consume('h.split', 'rx')}), 'f|fail_closed',
			"(3x) $name: the fail mode decides, never a grant");
		$fake->stop;
	}
	$r->quit;
	$home->stop;
	$node->safe_psql('postgres', q{
		DELETE FROM rl_policy WHERE name = 'h.split';
		ALTER SYSTEM RESET ratelimit.region;
		ALTER SYSTEM RESET ratelimit.regions;
		SELECT pg_reload_conf();
	});
}

# (3a'') A Redis older than 7 knows no shebang: a peek's script (marked no-writes for
# Redis 7, so that replicas and EVALSHA_RO may run it) fails to compile there. No Redis 6
# is installed here: this fake answers as one does (NOSCRIPT, then the compile error for a
# body that starts with "#!"), and counts in its reply how many such bodies it was sent.
# The backend sends the script again without the line, and remembers.
{
	my $shebangs = 0;
	my $fake = fake_redis_start(
		reply => sub {
			my ($command, $body) = @_;
			return "-NOSCRIPT No matching script. Please use EVAL.\r\n" if $command eq 'EVALSHA';
			return "+OK\r\n" if $command ne 'EVAL';
			if ($body =~ /\A#!/)
			{
				$shebangs++;
				return "-ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'\r\n";
			}
			return "*4\r\n:1\r\n:$shebangs\r\n:0\r\n:0\r\n";
		});
	set_url($h, $fake->url);
	is($h->query("SELECT allowed, remaining, source FROM rl_peek('h.closed', 'old_redis')"), 't|1|redis',
		"(3a'') rl_peek on a Redis without shebangs: answered by the script without one");
	is($h->query("SELECT allowed, remaining, source FROM rl_peek('h.closed', 'old_redis')"), 't|1|redis',
		"(3a'') the next peek sends no shebang again");
	$fake->stop;
}

# (3a''') A slice's reply that claims more tokens than were asked for (an allowance's
# slice asks for at most 2 here): refused, never held as a slice of a million. The fake
# grants takes (sha, 1, key and 6 numbers) and answers slices (7 numbers) with a million.
# Slices are the server's, for the server's Redis (a session with a URL of its own takes
# none): the fake is the server's Redis for a while.
{
	my $fake = fake_redis_start(
		reply => sub {
			my ($command, @args) = @_;
			return "-ERR unexpected\r\n" unless $command eq 'EVALSHA';
			return @args == 10 ? "*4\r\n:1000000\r\n:0\r\n:0\r\n:0\r\n" : "*4\r\n:1\r\n:999\r\n:0\r\n:0\r\n";
		});
	$node->safe_psql('postgres', 'ALTER SYSTEM SET ratelimit.redis_url = ' . quote_literal($fake->url));
	$node->reload;
	$node->poll_query_until('postgres', q{SELECT current_setting('ratelimit.redis_url') LIKE '%:} . $fake->port . q{'})
	  or die 'the fake is not the server\'s Redis';
	my $s = session($node, options => "-c ratelimit.command_timeout=${timeout_ms}ms");
	my $d = $s->consume('h.allowance', $subject{slice});
	is("$d->{allowed} $d->{source}", 't redis', "(3a''') a take: granted");
	is_fail_mode($s->consume('h.allowance', $subject{slice}), 'h.allowance',
		"(3a''') the slice of a million");
	is($s->query(q{SELECT redis_errors->>'protocol' FROM rl_stats WHERE policy = 'h.allowance'}), '1',
		"(3a''') counted in rl_stats as a protocol error");
	isnt($s->consume('h.allowance', $subject{slice})->{source}, 'allowance',
		"(3a''') and nothing is granted from it");
	$s->quit;
	$node->safe_psql('postgres', 'ALTER SYSTEM RESET ratelimit.redis_url');
	$node->reload;
	$node->poll_query_until('postgres', q{SELECT current_setting('ratelimit.redis_url') NOT LIKE '%:} . $fake->port . q{'})
	  or die 'the real Redis is not the server\'s again';
	$fake->stop;
}

# (3a'''') A script that fails on the request's own values (a Lua error: 0.8.0's sliding
# log did, for costs of 4,000 and more) is an error with a SQLSTATE, never the fail mode: an
# 'open' policy would grant without counting, however often. No script of ours fails so
# now, so a fake answers as Redis 7 does for one that does.
{
	my $lua_error = "-ERR user_script:41: too many results to unpack script: 6c1fa2d0, on \@user_script:41.\r\n";
	my $fake = fake_redis_start(reply => sub { $_[0] =~ /^EVAL/ ? $lua_error : "-ERR unexpected\r\n" });
	set_url($h, $fake->url);
	my $counted_sql = q{SELECT coalesce(sum(decisions), 0) FROM rl_stats WHERE policy IN ('h.open', 'h.closed')};
	my $counted_before = $h->query($counted_sql);
	for my $policy (qw(h.open h.closed))
	{
		my $d = $h->consume($policy, $subject{fake});
		is(sqlstate_of($d->{stderr}), '54000', "(3a'''') $policy: the script's failure is an error (54000)")
		  or diag explain $d;
		like($d->{stderr}, qr/Redis could not run the script of rate limit policy "\Q$policy\E" for this request/,
			"(3a'''') $policy: saying so");
		like($d->{stderr}, qr/DETAIL:  The script failed: user_script:41: too many results to unpack\./,
			"(3a'''') $policy: with the script's message");
		is($d->{allowed}, undef, "(3a'''') $policy: no decision, so no grant");
	}
	is($h->query($counted_sql), $counted_before,
		"(3a'''') nor is one counted in rl_stats: the caller saw an error");
	my (undef, $many_err) = $h->query(q{SELECT * FROM rl_consume_many('h.open', ARRAY['a', 'b'])});
	is(sqlstate_of($many_err), '54000', "(3a'''') rl_consume_many: an error too");
	my (undef, $all_err) = $h->query(q{SELECT * FROM rl_consume_all(ARRAY['h.open'], ARRAY['a'])});
	is(sqlstate_of($all_err), '54000', "(3a'''') rl_consume_all: an error too");
	is($h->query(q{SELECT source_fail_open FROM rl_stats WHERE policy = 'h.open'}) // '0', '0',
		"(3a'''') no decision of h.open was its fail mode");
	is(health($h)->{breaker}, 'closed', "(3a'''') Redis answered: the breaker stays closed");
	$fake->stop;
}

# (3a') Malformed replies that a scan must refuse rather than a reader trust: a status
# line holding a LF (which a reader that looked for the LF would take as the end of the
# line, and read what follows as a header of its own), a NUL in a header, a bulk string
# whose CRLF is missing, a RESP3 type. The fail mode, and the backend alive.
for my $case (
	[ 'status line with a LF', "*4\r\n*2\r\n+a\n*9\r\n:1\r\n:1\r\n:1\r\n:1\r\n" ],
	[ 'NUL in a header', "*4\r\n:1\0\r\n:1\r\n:1\r\n:1\r\n" ],
	[ 'bulk without its CRLF', "*4\r\n\$1\r\nxyz\r\n:1\r\n:1\r\n:1\r\n" ],
	[ 'a RESP3 double', "*4\r\n,1.5\r\n:1\r\n:1\r\n:1\r\n" ])
{
	my ($name, $bytes) = @$case;
	my $fake = fake_redis_start(reply => sub { $_[0] eq 'EVALSHA' ? $bytes : "-ERR unexpected\r\n" });
	set_url($h, $fake->url);
	is_fail_mode($h->consume('h.closed', $subject{hostile}), 'h.closed', "(3a') $name");
	is($h->query('SELECT 1'), '1', "(3a') $name: the backend is still usable");
	is(health($h)->{last_error}, 'protocol: malformed reply',
		"(3a') $name: rl_health().last_error: 'protocol: malformed reply'");
	$fake->stop;
}

# (3b) Replies whose header claims what would take gigabytes, followed by an
# endless stream: the fail mode within command_timeout + 100 ms, and the
# backend's peak memory hardly moves. The third claims an array the byte
# bound allows by its count (300000 elements of at least 3 bytes), whose
# elements then run past it (":1\r\n" is 4 bytes): refused mid-scan.
for my $case (
	[ 'array of 2e9 integers', "*2000000000\r\n", ":1\r\n", 'h.closed' ],
	[ 'bulk string of 1 GiB', "\$1073741824\r\n", 'a', 'h.open' ],
	[ 'array of 300000 integers', "*300000\r\n", ":1\r\n", 'h.closed' ])
{
	my ($name, $head, $stream, $policy) = @$case;
	my $fake = fake_redis_start(
		reply => sub {
			$_[0] eq 'EVALSHA' ? { head => $head, stream => $stream } : "-ERR unexpected\r\n";
		});
	set_url($h, $fake->url);
	my $before = backend_peak_kb($h->pid);
	my ($elapsed, $d) = timed(sub { $h->consume($policy, $subject{hostile}) });
	my $after = backend_peak_kb($h->pid);
	note sprintf('(3b) %s: fail mode after %.1f ms; backend peak RSS %d kB -> %d kB (+%d kB)',
		$name, $elapsed * 1000, $before, $after, $after - $before);
	is_fail_mode($d, $policy, "(3b) $name, streamed forever");
	cmp_ok($elapsed * 1000, '<', $timeout_ms + 100,
		"(3b) $name: within command_timeout + 100 ms");
	cmp_ok($after - $before, '<', 8 * 1024, "(3b) $name: peak RSS grows by less than 8 MB");
	is($h->query('SELECT 1'), '1', "(3b) $name: the backend is still usable");
	is(health($h)->{last_error}, 'protocol: reply too large',
		"(3b) $name: rl_health().last_error: 'protocol: reply too large'");
	$fake->stop;
}

# (3c) pg_cancel_backend while a server trickles a reply that never ends (one
# byte every 20 ms), with a command_timeout of 10 s. The trickler records each
# byte it sent in a file, so the test knows the backend is reading it.
{
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $sent_file = "$dir/sent";
	my $listener = IO::Socket::INET->new(
		LocalAddr => '127.0.0.1',
		LocalPort => 0,
		Listen => 4,
		ReuseAddr => 1) or die "could not listen: $!";
	my $port = $listener->sockport;
	my $trickler = fork();
	die "fork failed: $!" unless defined $trickler;
	if ($trickler == 0)
	{
		local $SIG{PIPE} = 'IGNORE';
		my $deadline = time + 60;
		my $client = $listener->accept or POSIX::_exit(1);
		my $request = '';
		while ($request !~ /EVALSHA/i && time < $deadline)
		{
			my $read = sysread($client, my $chunk, 65536);
			POSIX::_exit(1) unless $read;
			$request .= $chunk;
		}
		# A bulk string of 900000 bytes (within the bound) that never arrives.
		syswrite($client, "*4\r\n\$900000\r\n") or POSIX::_exit(1);
		while (time < $deadline)
		{
			last unless defined syswrite($client, 'a');
			open(my $fh, '>>', $sent_file) or last;
			print $fh 'a';
			close $fh;
			usleep(20_000);
		}
		POSIX::_exit(0);
	}
	close $listener;

	set_url($h, "redis://127.0.0.1:$port");
	$h->query_ok("SET ratelimit.command_timeout = '10s'");
	my $pid = $h->pid;
	my $offset = log_offset($node);
	$h->start_query(decision_sql('h.closed', $subject{trickle}));
	# 10 bytes trickled: the backend sent its script and is reading the reply.
	my $deadline = time + 10;
	usleep(10_000) while (-s $sent_file // 0) < 10 && time < $deadline;
	cmp_ok(-s $sent_file // 0, '>=', 10, '(3c) the fake trickles its reply');
	ok(!$h->done, '(3c) the decision is still waiting for the rest of the reply');
	my $cancel_start = time;
	is($node->safe_psql('postgres', "SELECT pg_cancel_backend($pid)"),
		't', '(3c) pg_cancel_backend sent');
	my ($out, $err) = $h->wait_result(15);
	my $cancel_elapsed = time - $cancel_start;
	note sprintf('(3c) the decision ended %.1f ms after pg_cancel_backend (%d bytes trickled)',
		$cancel_elapsed * 1000, -s $sent_file);
	is(sqlstate_of($err), '57014', '(3c) the decision is cancelled (57014)') or diag $err;
	cmp_ok($cancel_elapsed, '<', 1, '(3c) within a second of the cancel');
	unlike(join("\n", pid_lines($offset, $pid)), qr/\Q$subject{trickle}\E/,
		'(3c) the cancel is logged without the statement');

	# The backend is usable, on the real Redis again; the connection cut off
	# is closed, never reused (the trickler sees its client go).
	$h->query_ok('RESET ratelimit.redis_url; RESET ratelimit.command_timeout');
	is($h->consume('h.closed', $subject{warm})->{source}, 'redis',
		'(3c) after the cancel, the same backend is decided by Redis');
	my $gone = 0;
	$deadline = time + 10;
	while (time < $deadline)
	{
		if (waitpid($trickler, POSIX::WNOHANG()) == $trickler)
		{
			$gone = 1;
			last;
		}
		usleep(20_000);
	}
	ok($gone, '(3c) the connection cut off was closed (the trickler saw its client go)');
	if (!$gone)
	{
		kill 'KILL', $trickler;
		waitpid($trickler, 0);
	}
}
$h->quit;

###
### (8) Scripts that fail halfway keep nothing.
###

# (8a) A user without PEXPIRE. Token buckets work, and every bucket key has a
# TTL (written by one SET ... PX); an acquire is refused before its first
# write: nothing is written.
{
	my $s = session($node);
	set_url($s, $url{rl});
	is($s->consume('h.closed', $subject{ttl})->{source}, 'redis',
		'(8a) no PEXPIRE: rl_consume is decided by Redis');
	is($s->consume('h.open', $subject{ttl})->{source}, 'redis', '(8a) on an open policy too');
	is( $s->query_ok(
			"SELECT string_agg(source, ',') FROM rl_consume_all(ARRAY['tb.tenant', 'tb.user'], "
			  . "ARRAY['acme', 'acme/bob'])"),
		'redis,redis',
		'(8a) rl_consume_all is decided by Redis');
	$s->query_ok('BEGIN');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_reserve('h.closed', %s, 5)",
				quote_literal($subject{ttl}))),
		'redis|994',
		'(8a) rl_reserve is decided by Redis');
	$s->query_ok('ROLLBACK');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_peek('h.closed', %s)", quote_literal($subject{ttl}))),
		'redis|999',
		'(8a) the ROLLBACK refunded the reservation (SET NX PX of its mark, SET PX of the bucket)');
	my @keys = $redis->scan_keys(0);
	my @refund_marks = grep { /:refund:/ } @keys;
	note sprintf('(8a) %d keys written by the user without PEXPIRE (%d refund marks)',
		scalar @keys, scalar @refund_marks);
	cmp_ok(scalar @keys, '>=', 5, '(8a) the buckets (and the refund mark) are in Redis');
	is(scalar @refund_marks, 1, '(8a) one of them is the refund mark');
	my @without_ttl = grep { $redis->cli('PTTL', $_) <= 0 } @keys;
	is(scalar @without_ttl, 0, '(8a) every one of them has a TTL (PTTL > 0)');

	my $offset = log_offset($node);
	is($s->query_ok(lease_sql('c.closed', $subject{lease})), 'f|0|fail_closed',
		'(8a) rl_acquire is refused: the fail mode (closed)');
	is(health($s)->{last_error}, 'permission: PEXPIRE',
		"(8a) rl_health().last_error: 'permission: PEXPIRE'");
	ok( scalar(grep { /does not allow PEXPIRE \(permission\)/ } pid_lines($offset, $s->pid)),
		'(8a) the log says the ACL does not allow PEXPIRE');
	is(scalar(keys_with(0, ':c.closed')), 0, '(8a) no lease set was written');

	# The same acquire by a user that may: the lease set appears where the
	# check above looked for it.
	set_url($s, $url{admin});
	is($s->query_ok(lease_sql('c.closed', $subject{lease}, 'session')), 't|2|redis',
		'(8a) control: the admin user takes the lease');
	is(scalar(keys_with(0, ':c.closed')), 1, '(8a) control: its lease set is found');
	is($s->query_ok("SELECT rl_release('c.closed', " . quote_literal($subject{lease}) . ')'),
		't', '(8a) control: released');
	is(scalar(keys_with(0, ':c.closed')), 0, '(8a) control: and gone');
	$s->quit;
}

# (8b) A user without SET: the fail mode, and nothing written.
{
	$redis->cli('FLUSHALL');
	my $s = session($node);
	set_url($s, $url{noset});
	my $offset = log_offset($node);
	is_fail_mode($s->consume('h.closed', $subject{noset}), 'h.closed', '(8b) no SET');
	is_fail_mode($s->consume('h.open', $subject{noset}), 'h.open', '(8b) no SET');
	is(health($s)->{last_error}, 'permission: SET', "(8b) rl_health().last_error: 'permission: SET'");
	ok( scalar(
			grep {
				/LOG:\s+ratelimit: Redis refused a command: the ACL of its user does not allow SET \(permission\)$/
			} pid_lines($offset, $s->pid)),
		'(8b) the log: the ACL of its user does not allow SET (permission)');
	is($redis->cli('DBSIZE'), '0', '(8b) nothing was written (DBSIZE 0)');
	is(scalar(keys_with(0, $subject{noset})), 0, "(8b) the subject's keys are absent");
	$s->quit;
}

# (8c) is below, with (11): both run out of memory.

# (8d) An error reply after an acquire that may have run keeps the lease
# listed: the fake records each command it receives (in its child process).
{
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $record = "$dir/commands";
	my $fake = fake_redis_start(
		reply => sub {
			my ($command) = @_;
			open(my $fh, '>>', $record) or die "cannot append to $record: $!";
			print $fh "$command\n";
			close $fh;
			return $command eq 'EVALSHA' ? "-ERR boom\r\n" : "-ERR unexpected\r\n";
		});
	my $s = session($node);
	set_url($s, $fake->url);
	my $offset = log_offset($node);
	$s->query_ok('BEGIN');
	is($s->query_ok(lease_sql('c.closed', $subject{fake})), 'f|0|fail_closed',
		'(8d) -ERR boom: rl_acquire decided by the fail mode');
	$s->query_ok('COMMIT');
	my $commands = '';
	my $deadline = time + 5;
	while (time < $deadline)
	{
		$commands = -e $record ? slurp_file($record) : '';
		last if ($commands =~ tr/\n//) >= 3;
		usleep(10_000);
	}
	# With the first call, after it, whether it is a Redis Cluster (the error says no).
	is($commands, "EVALSHA\nCLUSTER\nEVALSHA\n",
		'(8d) the fake received two EVALSHA: the acquire (and CLUSTER SLOTS once after it), and the release at COMMIT');
	ok( scalar(
			grep { /1 lease was not released: Redis refused it \(error reply: ERR\)/ }
			  pid_lines($offset, $s->pid)),
		'(8d) the release refused too is logged');
	$s->quit;
	$fake->stop;
}

# (8e) A Redis that never keeps a script (as Redis 7.4 may evict one EVAL loaded):
# every EVALSHA answers NOSCRIPT, every EVAL decides. A rollback's three refunds go
# in one pipeline: the first carries the script; the other two answer NOSCRIPT, go
# again, the first of them with the script; the last answers NOSCRIPT once more and
# goes with the script too. All three are refunded, none is lost.
{
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $record = "$dir/commands";
	my $fake = fake_redis_start(
		reply => sub {
			my ($command) = @_;
			open(my $fh, '>>', $record) or die "cannot append to $record: $!";
			print $fh "$command\n";
			close $fh;
			return $command eq 'EVALSHA' ? "-NOSCRIPT No matching script\r\n"
			  : $command eq 'EVAL' ? "*4\r\n:1\r\n:5\r\n:0\r\n:0\r\n" : "-ERR unexpected\r\n";
		});
	my $s = session($node);
	set_url($s, $fake->url);
	my $offset = log_offset($node);
	$s->query_ok('BEGIN');
	for my $n (1 .. 3)
	{
		is( $s->query_ok(
				sprintf("SELECT allowed, source FROM rl_reserve('h.closed', %s, 1)",
					quote_literal("$subject{refund}_$n"))),
			't|redis',
			"(8e) reservation $n: decided by EVAL after NOSCRIPT");
	}
	unlink $record;
	$s->query_ok('ROLLBACK');
	my $commands = '';
	my $deadline = time + 5;
	while (time < $deadline)
	{
		$commands = -e $record ? slurp_file($record) : '';
		last if ($commands =~ tr/\n//) >= 6;
		usleep(10_000);
	}
	is($commands, "EVAL\nEVALSHA\nEVALSHA\nEVAL\nEVALSHA\nEVAL\n",
		'(8e) the refunds: one with the script, two NOSCRIPT, one of them with the script, the last NOSCRIPT again and then with it');
	is($s->query_ok('SELECT 1'), '1', '(8e) the session is out of its transaction');
	unlike(join("\n", pid_lines($offset, $s->pid)), qr/not been refunded|not refunded/,
		'(8e) no refund is lost');
	$s->quit;
	$fake->stop;
}

###
### (10) ACL.
###

# (10a) The minimal ACL for users (docs/operations.md, "A Redis user for ratelimit"),
# the default user off, database 3: every function answers from Redis.
{
	$redis->cli('FLUSHALL');
	my $s = session($node);
	my $offset = log_offset($node);
	my $d = $s->consume('h.closed', $subject{a});
	is_deeply([ @$d{qw(source remaining stderr)} ], [ 'redis', 999, '' ],
		'(10a) rl_consume: Redis decides')
	  or diag explain $d;

	$s->query_ok('BEGIN');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_reserve('h.closed', %s, 5)",
				quote_literal($subject{r}))),
		'redis|995',
		'(10a) rl_reserve: Redis decides');
	$s->query_ok('ROLLBACK');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_peek('h.closed', %s)", quote_literal($subject{r}))),
		'redis|1000',
		'(10a) ROLLBACK: refunded in Redis');

	$s->query_ok('BEGIN');
	is($s->query_ok(lease_sql('c.closed', $subject{l})), 't|2|redis', '(10a) rl_acquire: granted by Redis');
	is($s->query_ok("SELECT rl_release('c.closed', " . quote_literal($subject{l}) . ')'),
		't', '(10a) rl_release: released in Redis');
	$s->query_ok('COMMIT');
	is($s->query_ok(lease_sql('c.closed', $subject{l}, 'peek')), 't|3|redis',
		'(10a) rl_peek on the concurrency policy: all leases free, by Redis');

	is($s->query_ok("SELECT rl_reset('h.closed', " . quote_literal($subject{a}) . ')'),
		't', '(10a) rl_reset: Redis forgot the bucket');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_peek('h.closed', %s)", quote_literal($subject{a}))),
		'redis|1000',
		'(10a) rl_peek after the reset: a full bucket, by Redis');
	is( $s->query_ok(
			"SELECT string_agg(source || ':' || remaining, ',') FROM rl_consume_all("
			  . "ARRAY['tb.tenant', 'tb.user'], ARRAY['acme', 'acme/bob'])"),
		'redis:999,redis:999',
		'(10a) rl_consume_all: both decided by Redis');
	unlike(join("\n", pid_lines($offset, $s->pid)), qr/Redis (cannot answer|refused)|not refunded|not released/,
		'(10a) nothing failed in the log');

	my @keys = $redis->scan_keys($db);
	my @keys_0 = $redis->scan_keys(0);
	note sprintf('(10a) %d keys in database %d, %d in database 0', scalar @keys, $db,
		scalar @keys_0);
	ok(scalar(@keys) >= 3 && !grep({ !/^rl:/ } @keys), "(10a) the keys are in database $db, all rl:*");
	ok(scalar(grep { /\{acme\}:tb\.tenant$/ } @keys) && scalar(grep { /\{acme\}\/bob:tb\.user$/ } @keys),
		"(10a) rl_consume_all's two buckets are among them");
	is(scalar @keys_0, 0, '(10a) database 0 has none');

	# The script cache flushed: EVALSHA answers NOSCRIPT, the script goes again with EVAL.
	$redis->cli('SCRIPT', 'FLUSH');
	my $evals = $redis->command_calls('eval');
	$d = $s->consume('h.closed', $subject{a});
	is_deeply([ @$d{qw(source remaining stderr)} ], [ 'redis', 999, '' ],
		'(10a) after SCRIPT FLUSH: Redis still decides')
	  or diag explain $d;
	cmp_ok($redis->command_calls('eval'), '>', $evals, '(10a) by EVAL (the fallback)');
	$s->quit;
}

# (10b) A user without EVALSHA: a permission failure that names it.
{
	my $s = session($node);
	set_url($s, $url{nosha});
	my $offset = log_offset($node);
	is_fail_mode($s->consume('h.closed', $subject{nosha}), 'h.closed', '(10b) no EVALSHA');
	is(health($s)->{last_error}, 'permission: EVALSHA',
		"(10b) rl_health().last_error: 'permission: EVALSHA'");
	my $lines = join("\n", pid_lines($offset, $s->pid));
	like($lines, qr/LOG:\s+ratelimit: Redis refused a command: the ACL of its user does not allow EVALSHA \(permission\)/,
		'(10b) the log names EVALSHA and says permission');
	unlike($lines, qr/error reply: ERR/, "(10b) not 'error reply: ERR'");
	$s->quit;
}

# (10c) A refund refused by Redis: the ACL loses SET between the reservation
# and the ROLLBACK.
{
	my $s = session($node);
	$s->query_ok('BEGIN');
	is( $s->query_ok(
			sprintf("SELECT source FROM rl_reserve('h.closed', %s, 5)", quote_literal($subject{refund}))),
		'redis',
		'(10c) rl_reserve: Redis decides');
	$redis->cli('ACL', 'SETUSER', 'ratelimit', '-set');
	my $offset = log_offset($node);
	my ($out, $err) = $s->query('ROLLBACK');
	is($err, '', '(10c) ROLLBACK raises nothing');
	my $lines = join("\n", pid_lines($offset, $s->pid));
	like($lines, qr/1 reservation was not refunded: Redis refused it \(permission: SET\)/,
		'(10c) the log: 1 reservation was not refunded: Redis refused it (permission: SET)');
	unlike($lines, qr/did not answer/, "(10c) not 'did not answer'");
	$redis->cli('ACL', 'SETUSER', 'ratelimit', '+set');
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_peek('h.closed', %s)",
				quote_literal($subject{refund}))),
		'redis|995',
		'(10c) the tokens were indeed not given back');
	$s->quit;
}

###
### (8c) and (11): out of memory (maxmemory below used_memory, noeviction).
###

# A 2 MB value (SETRANGE: no 2 MB argument), then maxmemory 1 MB below what is used.
sub oom_on
{
	$redis->cli('SETRANGE', 'ballast', 2_000_000, 'x');
	my ($used) = $redis->cli('INFO', 'memory') =~ /^used_memory:(\d+)/m;
	$redis->cli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
	$redis->cli('CONFIG', 'SET', 'maxmemory', $used - 1_000_000);
}

sub oom_off
{
	$redis->cli('CONFIG', 'SET', 'maxmemory', 0);
	$redis->cli('DEL', 'ballast');
}

# (8c) Under OOM nothing is written: no lease, no bucket; peeks still answer.
{
	my $holder = session($node);
	is($holder->query_ok(lease_sql('c.closed', $subject{oom}, 'session')), 't|2|redis',
		'(8c) before OOM: a session holds a lease');
	my $s = session($node);
	is($s->consume('h.closed', $subject{bucket})->{source}, 'redis', '(8c) before OOM: a bucket is written');
	my ($lease_key) = keys_with($db, ':c.closed');
	my ($bucket_key) = grep { index($_, $subject{bucket}) >= 0 } keys_with($db, ':h.closed');
	ok(defined $lease_key && defined $bucket_key, '(8c) both keys are in Redis');
	# An expired lease too: an acquire that removed expired leases before its
	# first refused write would change the set (ZREMRANGEBYSCORE is allowed
	# under OOM, and a script that wrote once may write on).
	$redis->cli('-n', $db, 'ZADD', $lease_key, 1, 'expired-lease');
	my $live_leases = sub {
		$redis->cli('-n', $db, 'ZRANGEBYSCORE', $lease_key, '(1', '+inf', 'WITHSCORES');
	};
	my $leases_before = $redis->cli('-n', $db, 'ZRANGE', $lease_key, 0, -1, 'WITHSCORES');
	my $live_before = $live_leases->();
	my $zcard_before = $redis->cli('-n', $db, 'ZCARD', $lease_key);
	my $bucket_before = $redis->cli('-n', $db, 'GET', $bucket_key);

	oom_on();
	my $offset = log_offset($node);
	$s->query_ok('BEGIN');
	is($s->query_ok(lease_sql('c.closed', $subject{oom})), 'f|0|fail_closed',
		'(8c) OOM: rl_acquire is not granted (the fail mode)');
	my $zcard_after = $redis->cli('-n', $db, 'ZCARD', $lease_key);
	note "(8c) OOM: ZCARD of the lease set $zcard_before before the acquire, $zcard_after after";
	is($zcard_after, $zcard_before, '(8c) the lease set is unchanged (ZCARD)');
	is($redis->cli('-n', $db, 'ZRANGE', $lease_key, 0, -1, 'WITHSCORES'),
		$leases_before, '(8c) the same leases, the same expiries');
	# The acquire may have run (an error reply): its lease is released at COMMIT,
	# a release that runs under OOM (and sweeps the expired lease).
	$s->query_ok('COMMIT');
	is($live_leases->(), $live_before, '(8c) after COMMIT the live lease is still there');
	unlike(join("\n", pid_lines($offset, $s->pid)), qr/not released/,
		'(8c) the release at COMMIT was answered');
	is_fail_mode($s->consume('h.closed', $subject{bucket}), 'h.closed', '(8c) OOM: rl_consume');
	is($redis->cli('-n', $db, 'GET', $bucket_key), $bucket_before, '(8c) its bucket is unchanged');
	is(health($s)->{last_error}, 'oom: OOM', "(8c) rl_health().last_error: 'oom: OOM'");
	is( $s->query_ok(
			sprintf("SELECT source, remaining FROM rl_peek('h.closed', %s)",
				quote_literal($subject{bucket}))),
		'redis|999',
		'(8c) OOM: rl_peek on the bucket still answers from Redis');
	is($s->query_ok(lease_sql('c.closed', $subject{oom}, 'peek')), 't|2|redis',
		'(8c) OOM: rl_peek on the leases too');
	oom_off();
	is($holder->query_ok("SELECT rl_release('c.closed', " . quote_literal($subject{oom}) . ')'),
		't', '(8c) memory back: the lease is released');
	$holder->quit;
	$s->quit;
}

###
### (11) Log floods: one session alternates a call that fails (OOM) and one
### that succeeds, 200 times each; retry_interval is 1 s.
###
{
	my $s = session($node);
	my $pid = $s->pid;
	is($s->consume('h.open', $subject{flood})->{source}, 'redis', '(11) before OOM: Redis decides');
	oom_on();
	my $offset = log_offset($node);
	my $consume = sprintf("SELECT source FROM rl_consume('h.open', %s);\n", quote_literal($subject{flood}));
	my $peek = sprintf("SELECT source FROM rl_peek('h.open', %s);\n", quote_literal($subject{flood}));
	my $n = 200;
	# 400 statements, one after the other, in one backend.
	my $sql = ($consume . $peek) x $n;
	my ($elapsed, $out) = timed(sub { scalar $s->query($sql, 60) });
	oom_off();
	my @sources = split /\n/, $out;
	is(scalar @sources, 2 * $n, "(11) $n rl_consume and $n rl_peek ran");
	is(scalar(grep { $sources[$_] eq ($_ % 2 ? 'redis' : 'fail_open') } 0 .. $#sources),
		2 * $n, '(11) each rl_consume failed open, each rl_peek was answered by Redis');
	my @lines = pid_lines($offset, $pid);
	my $failures = grep { /ratelimit: Redis cannot answer \(oom: OOM\)/ } @lines;
	my $again = grep { /ratelimit: Redis answers again/ } @lines;
	note sprintf('(11) %d alternations in %.0f ms: %d "cannot answer (oom: OOM)" lines, '
		  . '%d "answers again" lines (%d log lines in all from the backend)',
		$n, $elapsed * 1000, $failures, $again, scalar @lines);
	cmp_ok($failures, '>=', 1, '(11) the failure is logged');
	cmp_ok($failures, '<=', 2 + $elapsed / $retry_s,
		'(11) "Redis cannot answer" at most 2 + elapsed seconds times');
	cmp_ok($again, '>=', 1, '(11) the recovery is logged');
	cmp_ok($again, '<=', 2 + $elapsed / $retry_s,
		'(11) "Redis answers again" at most 2 + elapsed seconds times');
	$s->quit;
}

###
### The documented set-up: the user in the URL, its password in a file only the server reads.
###

{
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $file = "$dir/redis.password";
	PostgreSQL::Test::Utils::append_to_file($file, "$user_pw\n");
	chmod 0600, $file;
	$node->append_conf('postgresql.conf', join("\n",
		"ratelimit.redis_url = 'redis://ratelimit\@127.0.0.1:" . $redis->port . "/$db'",
		"ratelimit.redis_password_file = '$file'", ''));
	$node->reload;
	ok($node->poll_query_until('postgres',
		q{SELECT source = 'redis' FROM rl_consume('h.closed', 'tenant_userfile')}),
		'(12) redis://ratelimit@host/db with ratelimit.redis_password_file: AUTH ratelimit <the file>');
}

###
### The whole log.
###

my $log = log_since($node, $log_start);
unlike($log, qr/\Q$_\E/, 'the log never names a subject') for grep { $_ ne 'acme' } @all_subjects;
unlike($log, qr/\bacme\b/, 'nor acme');
unlike($log, qr/\Q$user_pw\E|\Q$admin_pw\E/, 'nor a password');
unlike($log, qr/terminated by signal|TRAP:|PANIC:/, 'no backend crashed');
$node->stop;
$redis->stop;
done_testing();
