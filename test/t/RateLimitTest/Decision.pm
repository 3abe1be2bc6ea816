
# Decisions for the ratelimit TAP tests, as text: the SQL that asks for one
# (decision_sql, with quote_literal for its arguments), the row psql -At prints
# for it turned back into a hash (parse_decision), one decision in a new
# session of a node (consume), and the SQLSTATE of an error psql reported
# (sqlstate_of). No processes of its own.

package RateLimitTest::Decision;

use strict;
use warnings;

use Exporter 'import';

our @EXPORT_OK = qw(quote_literal sqlstate_of decision_sql parse_decision consume);

# The SQL literal for a string.
sub quote_literal
{
	my ($text) = @_;
	$text =~ s/'/''/g;
	return "'$text'";
}

# The SQLSTATE of the first error in psql's (VERBOSITY=verbose) stderr, or ''.
sub sqlstate_of
{
	my ($stderr) = @_;
	return ($stderr // '') =~ /(?:ERROR|FATAL):\s+([0-9A-Z]{5}):/ ? $1 : '';
}

# SELECT of every field of one decision.
sub decision_sql
{
	my ($policy, $subject, $cost, $function) = @_;
	return sprintf(
		'SELECT allowed, remaining, capacity, retry_after_ms, reset_after_ms, policy, version, source FROM %s(%s, %s, %d)',
		$function // 'rl_consume',
		quote_literal($policy), quote_literal($subject), $cost // 1);
}

# A hash of the fields of one decision row printed by psql -At, or undef.
sub parse_decision
{
	my ($line) = @_;
	return undef unless defined $line;
	chomp $line;
	my @fields = split /\|/, $line, -1;
	return undef unless @fields == 8;
	my %decision;
	@decision{qw(allowed remaining capacity retry_after_ms reset_after_ms policy version source)} =
	  @fields;
	return \%decision;
}

# One decision in a new session of node (dies on an SQL error).
sub consume
{
	my ($node, $policy, $subject, $cost, %opt) = @_;
	my $sql = decision_sql($policy, $subject, $cost);
	$sql = "$opt{setup}; $sql" if $opt{setup};
	return parse_decision(
		$node->safe_psql($opt{db} // 'postgres', $sql, timeout => 60));
}

1;
