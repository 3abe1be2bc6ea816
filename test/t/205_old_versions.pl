
# Every released SQL version works with the new library, or fails with a clear error, until
# ALTER EXTENSION ratelimit UPDATE: between installing a new library and updating, the
# objects of the old version call it. For each version older than the default, a database
# made with it: every function of that version called (with arguments a caller would give)
# and every view read, by each role the manual names (a superuser, ratelimit_admin,
# ratelimit_user, and a role with no grant), and the exporter's queries run. The server
# never restarts (0.8.0 killed it: rl_stats of 0.3.0-0.6.0 read by the 0.8.0 library), no
# error is XX000, and the decision functions of every version decide.

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use FindBin;
use Test::More;

use RateLimitTest;

my $redis = redis_start(name => 'old_versions');
my $node = rl_node('old_versions', redis => $redis, create_extension => 0);
my $started = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

my ($default) = slurp_file("$FindBin::Bin/../../ratelimit.control") =~ /^default_version = '([^']+)'/m;
my @versions = grep { $_ ne $default } split /\n/,
  $node->safe_psql('postgres',
	"SELECT version FROM pg_available_extension_versions WHERE name = 'ratelimit' ORDER BY string_to_array(version, '.')::int[]");
cmp_ok(scalar @versions, '>=', 7, 'every released version is available: ' . join(', ', @versions));

# The exporter's queries (monitoring/postgres_exporter.yaml), as written there.
my @exporter;
{
	my $yaml = slurp_file("$FindBin::Bin/../../monitoring/postgres_exporter.yaml");
	while ($yaml =~ /^  query: \|\n((?:    .*\n|\s*\n)+)/mg)
	{
		(my $query = $1) =~ s/^    //mg;
		push @exporter, $query;
	}
}
cmp_ok(scalar @exporter, '>=', 4, 'the exporter\'s queries were read');

# The roles the manual names (docs/operations.md, "Privileges and security"), and one without a grant.
$node->safe_psql('postgres', q{
	CREATE ROLE ratelimit_admin NOLOGIN;
	CREATE ROLE ratelimit_user NOLOGIN;
	CREATE ROLE ops LOGIN IN ROLE ratelimit_admin;
	CREATE ROLE app LOGIN IN ROLE ratelimit_user;
	CREATE ROLE nobody LOGIN;
	GRANT pg_monitor TO ratelimit_admin;
});

# An argument a caller would give, by its name and type; a typed NULL where the default is.
my %by_name = (
	'text:policy' => "'old.tb'",
	'text:name' => "'old.tb'",
	'text:subject' => "'tenant_1'",
	'text:scope' => "'transaction'",
	'text:fail_mode' => "'closed'",
	'text:algorithm' => "'token_bucket'",
	'text:time_zone' => "'UTC'",
	'text:zone' => "'UTC'",
	'text:object' => "'policy'",
	'text[]:policies' => "ARRAY['old.tb']",
	'text[]:subjects' => "ARRAY['tenant_1']",
	'bigint[]:costs' => 'NULL::bigint[]',
	'bigint:cost' => '1',
	'bigint:allowance' => 'NULL::bigint',
	'bigint:rollover' => 'NULL::bigint',
	'interval:idle_ttl' => 'NULL::interval',
	'interval:allowance_ttl' => 'NULL::interval',
	'numeric:local_share' => '1',
);
my %by_type = (
	'text' => "'x'",
	'bigint' => '10',
	'integer' => '10',
	'interval' => "'1 minute'::interval",
	'numeric' => '1',
	'boolean' => 'false',
	'jsonb' => "'{}'::jsonb",
	'rl_decision' => q{jsonb_populate_record(NULL::rl_decision, '{"allowed": false, "remaining": 0, "capacity": 10, "retry_after_ms": 6000, "reset_after_ms": 6000, "policy": "old.tb", "version": 1, "source": "redis", "waited_ms": 0}')},
);

# The calls of every function of the extension in database db (trigger functions are run
# by writes instead), and its views.
sub calls_of
{
	my ($db) = @_;
	my @calls;
	foreach my $row (split /\n/, $node->safe_psql($db, q{
		SELECT p.proname || '|' || coalesce(array_to_string(p.proargnames, ','), '') || '|'
		       || coalesce((SELECT string_agg(format_type(t, NULL), ',' ORDER BY n)
		                    FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, n)), '')
		FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
		WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'ratelimit')
		  AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
		  AND p.prorettype <> 'trigger'::regtype
		ORDER BY 1}))
	{
		my ($name, $argnames, $types) = split /\|/, $row, -1;
		my @names = split /,/, $argnames;
		my @types = split /,/, $types;
		my @args = map {
			my $key = "$types[$_]:" . ($names[$_] // '');
			$by_name{$key} // $by_type{ $types[$_] } // "NULL::$types[$_]"
		} 0 .. $#types;
		# Leases need a concurrency policy.
		s/'old\.tb'/'old.cc'/ for grep { $name =~ /^rl_(acquire|release)$/ } @args;
		# An overloaded name (rl_usage of one subject or many) by its argument types.
		push @calls, [ (grep { $_->[2] eq $name } @calls) ? "$name($types)" : $name,
			"SELECT * FROM $name(" . join(', ', @args) . ')', $name ];
	}
	push @calls, map { [ "view $_", "SELECT * FROM $_" ] } split /\n/, $node->safe_psql($db, q{
		SELECT c.relname FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
		WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'ratelimit')
		  AND d.classid = 'pg_class'::regclass AND d.deptype = 'e' AND c.relkind IN ('v', 'r')
		ORDER BY 1});
	push @calls, map { [ "exporter query $_", $exporter[$_] ] } 0 .. $#exporter;
	return @calls;
}

# Runs every call as role in db, each in its own subtransaction: what each gave ('ok' or
# its SQLSTATE), by name. A crash ends the script: what is missing then is missing.
sub run_calls
{
	my ($db, $role, @calls) = @_;
	my $script = '';
	foreach my $call (@calls)
	{
		my ($name, $sql) = @$call;
		(my $quoted = $sql) =~ s/'/''/g;
		$script .= "DO \$do\$ BEGIN EXECUTE '$quoted'; RAISE NOTICE 'RESULT % ok', "
		  . "'$name'; EXCEPTION WHEN OTHERS THEN RAISE NOTICE 'RESULT % %: %', '$name', SQLSTATE, SQLERRM; END \$do\$;\n";
	}
	my ($stdout, $stderr);
	$node->psql($db, $script, stdout => \$stdout, stderr => \$stderr,
		extra_params => [ '-U', $role ]);
	my %result;
	while ($stderr =~ /RESULT (.+?) (ok|[0-9A-Z]{5}: .*)$/mg)
	{
		$result{$1} = $2;
	}
	return \%result;
}

foreach my $version (@versions)
{
	(my $db = "v_$version") =~ s/\./_/g;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION ratelimit VERSION '$version'");
	# A policy of every version's kind, and the manual's grants where this version has the function.
	$node->safe_psql($db, q{
		SELECT rl_define('old.tb', 10, per => '1 minute');
		INSERT INTO rl_policy (name, algorithm, capacity, idle_ttl) VALUES ('old.cc', 'concurrency', 2, '15 minutes');
		GRANT SELECT, INSERT, UPDATE, DELETE ON rl_policy TO ratelimit_admin;
		DO $$
		DECLARE f text;
		BEGIN
			IF to_regclass('rl_override') IS NOT NULL THEN
				GRANT SELECT, INSERT, UPDATE, DELETE ON rl_override TO ratelimit_admin;
			END IF;
			IF to_regclass('rl_policy_history') IS NOT NULL THEN
				GRANT SELECT ON rl_policy_history TO ratelimit_admin;
			END IF;
			FOREACH f IN ARRAY ARRAY['rl_refund(text, text, bigint)', 'rl_reset(text, text)',
			                         'rl_peek(text, text, bigint)'] LOOP
				IF to_regprocedure(f) IS NOT NULL THEN
					EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO ratelimit_admin', f);
				END IF;
			END LOOP;
			FOREACH f IN ARRAY ARRAY['rl_consume(text, text, bigint)', 'rl_enforce(text, text, bigint)',
			                         'rl_reserve(text, text, bigint)', 'rl_peek(text, text, bigint)',
			                         'rl_acquire(text, text, text)', 'rl_release(text, text)',
			                         'rl_consume_all(text[], text[], bigint[])',
			                         'rl_consume_many(text, text[], bigint[])',
			                         'rl_headers(rl_decision, boolean)',
			                         'rl_response_headers(rl_decision, boolean)',
			                         -- 0.10.0's signatures (max_wait, request_id)
			                         'rl_consume(text, text, bigint, interval, text)',
			                         'rl_enforce(text, text, bigint, interval, text)',
			                         'rl_reserve(text, text, bigint, interval, text)',
			                         'rl_acquire(text, text, text, interval)',
			                         'rl_consume_all(text[], text[], bigint[], text)',
			                         'rl_consume_many(text, text[], bigint[], text[])'] LOOP
				IF to_regprocedure(f) IS NOT NULL THEN
					EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO ratelimit_user', f);
				END IF;
			END LOOP;
		END $$;
		-- The trigger functions, run by writes: a policy changed, a table charged per row.
		UPDATE rl_policy SET capacity = 20 WHERE name = 'old.tb';
		CREATE TABLE charged (tenant text);
		CREATE TRIGGER charge BEFORE INSERT ON charged FOR EACH ROW
			EXECUTE FUNCTION rl_limit_trigger('old.tb', 'tenant');
		GRANT INSERT ON charged TO PUBLIC;
	});
	my @calls = (calls_of($db), [ 'rl_limit_trigger', "INSERT INTO charged VALUES ('tenant_trigger')" ]);

	foreach my $role (qw(postgres ops app nobody))
	{
		my $result = run_calls($db, $role, @calls);
		is(scalar(keys %$result), scalar @calls, "$version as $role: every call returned (no crash)")
		  or diag explain [ grep { !exists $result->{ $_->[0] } } @calls ];
		my @internal = grep { $result->{$_} =~ /^XX000/ } sort keys %$result;
		is_deeply(\@internal, [], "$version as $role: no internal error (XX000)")
		  or diag explain { map { $_ => $result->{$_} } @internal };
		if ($role eq 'postgres')
		{
			my @failed = grep { $result->{$_} ne 'ok' && !/^exporter/ } sort keys %$result;
			is_deeply(\@failed, [], "$version as the superuser: every function and view works")
			  or diag explain { map { $_ => $result->{$_} } @failed };
		}
		elsif ($role eq 'ops')
		{
			# pg_monitor reads the statistics (the exporter left running through an upgrade).
			is($result->{'view rl_stats'} // 'ok', 'ok', "$version as ratelimit_admin: rl_stats is read");
			is($result->{rl_health}, 'ok', "$version as ratelimit_admin: rl_health is read");
		}
		elsif ($role eq 'app')
		{
			is($result->{rl_consume}, 'ok', "$version as ratelimit_user: rl_consume decides");
			like($result->{'view rl_policy'}, qr/^42501/, "$version as ratelimit_user: rl_policy is not readable");
		}
		elsif ($role eq 'nobody')
		{
			like($result->{rl_consume}, qr/^42501/, "$version without a grant: rl_consume is refused");
		}
	}
	# And the update still works from there.
	$node->safe_psql($db, 'ALTER EXTENSION ratelimit UPDATE');
	is($node->safe_psql($db, "SELECT allowed FROM rl_consume('old.tb', 'tenant_9')"), 't',
		"$version updated to $default: it decides");
}

is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $started,
	'the server never restarted');
unlike(slurp_file($node->logfile), qr/terminated by signal|server process .* was terminated/,
	'no backend was killed by a signal');

done_testing();
