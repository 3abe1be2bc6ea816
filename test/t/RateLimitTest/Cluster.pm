
# A private Redis Cluster for the ratelimit TAP tests: three masters, each with
# one replica, six redis-server processes on 127.0.0.1 (RateLimitTest::Redis
# nodes, each in its own temporary directory with its own nodes.conf and a free
# port and cluster bus port, no persistence), made with redis-cli --cluster
# create. new returns once every node says cluster_state:ok, every node names
# the same master for every slot, every replica is in sync and
# redis-cli --cluster check passes. The processes are registered with
# RateLimitTest::Children: killed at END if the test has not stopped them.
#
#   my $cluster = RateLimitTest::Cluster->new(%options);
#
# Options: name (of the log files, default "cluster"), node_timeout_ms
# (cluster-node-timeout, default 1000), password (requirepass and masterauth on
# every node), acl (ACL SETUSER argument lists as for RateLimitTest::Redis,
# applied on every node at every start, the first an administrator: the
# replicas sync as it, MIGRATE and redis-cli log in as it), args (more
# redis-server arguments for every node), timeout (seconds to wait for the
# cluster to form, default 60).
#
# Redis 7.0 (fixed in 7.2, redis/redis#12564) can lose a slot that was moved
# once a failover follows: a gossip message from before the move, read after
# a newer one, leaves the replica's mark "its owner no longer claims it" on
# the slot (nothing clears it while the owner's slots stay the same); when the
# replica takes over, the old master's last claim then takes the slot back
# from it, deleting its keys there, and the old master turning replica leaves
# the slot unassigned on the new master, cluster_state:fail there for good.
# Rare (about one manual failover in 50, in a loop that moved 300 slots to
# the master and back before each); the waits below give a master back, with
# CLUSTER ADDSLOTS and a diag, the slots it lost that every other node says it
# owns (repaired_slots lists them), but their keys are gone.
#
# The nodes are RateLimitTest::Redis objects (port, url, pid, cli(@args),
# command_calls, stop, kill9, pause, resume, start, restart). A node started
# again keeps its nodes.conf, so it rejoins the cluster with its node id, but
# with an empty dataset; a master that comes back after its replica took over
# becomes the new master's replica (wait_until_ok waits for that). A node
# counts as running while it has a process (a paused one too: pass it as
# except, or use wait_for_failover_of). Until a killed master's replica takes
# over (about 2-3 s with node_timeout_ms 1000), every node answers CLUSTERDOWN
# for every slot (cluster-require-full-coverage yes, the default; pass
# args => ['--cluster-require-full-coverage', 'no'] for the other behaviour).
#
# Methods:
#   masters, replicas   the nodes by their role at creation (a list, or an
#                       array ref in scalar context): masters[i] owned the i-th
#                       slot range (0-5460, 5461-10922, 10923-16383) and
#                       replicas[i] was its replica; they do not follow
#                       failovers (master_for_slot and role do)
#   nodes               the six, masters first
#   replica_of($master) the node created as the replica of $master
#   url(%opt)           redis://[userinfo@]127.0.0.1:PORT of the first master
#   seeds_url(%opt)     redis://[userinfo@]127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 (the masters)
#   slot_of($key)       the hash slot of a key, as Redis computes it (CRC16-XMODEM
#                       mod 16384 of the key's bytes, or of the content of its
#                       first {...} when non-empty); a character string counts
#                       as its UTF-8 bytes
#   crc16($bytes)       (a function) CRC16-XMODEM, as Redis's crc16.c
#   key_for_slot($slot, $prefix)  "$prefix$n" for the smallest n >= 0 in that
#                       slot (also usable as a hash tag's content)
#   master_for_slot($slot)  the node that owns a slot now (as the first running
#                       node that answers says)
#   slot_map            [ owner port of slot 0, ..., of slot 16383 ], as the
#                       first running node that answers says
#   move_slot($slot, $to, %opt)  moves a slot and its keys from its owner to
#                       master $to the manual way (SETSLOT IMPORTING on $to,
#                       MIGRATING on the owner, GETKEYSINSLOT and MIGRATE in
#                       batches, SETSLOT NODE on $to, the owner and the other
#                       masters) and waits until every running node names $to;
#                       returns the number of keys moved. Options: batch (keys
#                       per MIGRATE, default 100), replace (MIGRATE ... REPLACE:
#                       a key the target has already is overwritten, not a
#                       BUSYKEY error), pause_between_keys (seconds:
#                       one key per MIGRATE, and this pause after each),
#                       on_migrating (called as ($slot, $from, $to) once the
#                       slot is MIGRATING and IMPORTING, before any key moves),
#                       on_batch (($slot, $keys_moved_so_far, [$keys_just_moved])
#                       after each MIGRATE),
#                       before_node (($slot, $from, $to) once every key is on $to,
#                       before SETSLOT NODE: every key of the slot answers ASK
#                       at $from), wait (0: do not wait for the nodes to agree)
#   move_slots([$slots], $to, %opt)  the same for many slots (each option as
#                       for move_slot, for each slot), waiting once at the end;
#                       returns the number of keys moved
#   migration_begin($slot, $to) / migration_keys($m, %opt) / migration_end($m)
#                       the three steps of move_slot, for a test that leaves a
#                       slot MIGRATING while it does something else:
#                       migration_keys moves (option count) or all keys (with
#                       batch, replace, pause_between_keys, on_batch) and returns how
#                       many moved; migration_end sets the owner and waits
#                       (option wait)
#   errorstat($node, $prefix)  errorstat_PREFIX count of INFO errorstats (MOVED,
#                       ASK, CROSSSLOT, ...; 0 when none); total_errorstat($prefix)
#                       over every running node (counts start at 0 when a node starts)
#   command_calls($node, $command)  calls of INFO commandstats (evalsha,
#                       asking, cluster|slots, ...); total_command_calls($command,
#                       %opt) over every running node (option masters_only: the
#                       nodes that are masters now; a replica counts the writes
#                       it replicates: SET, ZADD, ... but not EVALSHA, whose
#                       effects replicate)
#   call($node, @args)  one command on a connection of our own (binary safe,
#                       authenticated); returns the reply (arrays as array refs,
#                       nested errors as RateLimitTest::Cluster::Error), dies on
#                       an error reply or after timeout (20 s, or
#                       local $RateLimitTest::Cluster::call_timeout)
#   node_id($node), role($node) ("master" or "slave", as the node says),
#   cluster_info($node) (CLUSTER INFO as a hash), node_for_port($port)
#   failover($replica, %opt)  CLUSTER FAILOVER on $replica (option mode: FORCE or
#                       TAKEOVER; without, it first waits until its master knows
#                       it as its replica and it is in sync, or the master
#                       ignores the request), then waits until it is master,
#                       owns its old master's slots on every running node, its
#                       old master (if running) is its replica and the cluster
#                       is ok everywhere (option timeout, 30 s); returns the
#                       seconds
#   wait_for_failover_of($master, %opt)  after $master was killed (or paused),
#                       waits until the slots it owned belong to another node,
#                       that node says it is master, and every other running
#                       node says cluster_state:ok and agrees (option timeout,
#                       30 s); returns the new master, and the seconds waited in
#                       list context
#   wait_until_ok(%opt) waits until every running node (but option except, a
#                       list of nodes) says cluster_state:ok, they all name the
#                       same master for every slot and the same roles (who is
#                       whose replica among them), and every running replica is in sync
#                       (option timeout, 30 s; sync 0: not the replicas);
#                       returns the seconds
#   check               runs redis-cli --cluster check against the first
#                       running node: (passed, output)
#   start_seconds       how long new took
#   repaired_slots      the slots given back (see above): ([port, slots...], ...)
#   stop_all            stops every node that runs
#
# What the nodes say is read with CLUSTER NODES, CLUSTER INFO and INFO (and
# AUTH on each connection), never CLUSTER SLOTS, CLUSTER SHARDS or ROLE: their
# counts in INFO commandstats are the clients' own. Error replies the helper
# gets are counted in errorstats like anyone's (none, unless a test asks for
# them with call).

package RateLimitTest::Cluster;

use strict;
use warnings;

use IO::Select;
use IO::Socket::INET;
use Test::More ();
use Time::HiRes qw(time usleep);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

use RateLimitTest::Children ();
use RateLimitTest::Redis;

our $call_timeout = 20;

my $SLOTS = 16384;
# The three ranges redis-cli --cluster create gives three masters.
my @RANGES = ([ 0, 5460 ], [ 5461, 10922 ], [ 10923, 16383 ]);

sub new
{
	my ($class, %opt) = @_;
	my $self = bless {
		name => $opt{name} // 'cluster',
		node_timeout_ms => $opt{node_timeout_ms} // 1000,
		password => $opt{password},
		acl => $opt{acl},
		args => $opt{args} // [],
		conns => {},
	}, $class;
	if ($self->{acl})
	{
		my ($user, @rules) = @{ $self->{acl}[0] };
		my ($password) = map { substr($_, 1) } grep { /^>/ } @rules;
		die "the first acl user needs a password (>...)" unless defined $password;
		$self->{auth} = [ $user, $password ];
	}
	elsif (defined $self->{password})
	{
		$self->{auth} = [ 'default', $self->{password} ];
	}
	my @replication =
	  $self->{acl} ? ('--masteruser', $self->{auth}[0], '--masterauth', $self->{auth}[1])
	  : defined $self->{password} ? ('--masterauth', $self->{password})
	  : ();

	my $start = time;
	my @nodes;
	foreach my $i (1 .. 6)
	{
		my $bus_port = PostgreSQL::Test::Cluster::get_free_port();
		push @nodes, RateLimitTest::Redis->new(
			name => "$self->{name}$i",
			password => $self->{password},
			acl => $self->{acl},
			args => [
				'--cluster-enabled' => 'yes',
				# Relative to --dir: each node's own.
				'--cluster-config-file' => 'nodes.conf',
				'--cluster-node-timeout' => $self->{node_timeout_ms},
				'--cluster-port' => $bus_port,
				# A replica syncs at once, not after 5 s.
				'--repl-diskless-sync-delay' => 0,
				@replication,
				@{ $self->{args} },
			]);
		$self->{bus_port}{ $nodes[-1]->port } = $bus_port;
	}
	$self->{all} = [@nodes];
	$self->{by_port} = { map { $_->port => $_ } @nodes };

	my ($status, $out, $err) = RateLimitTest::Children::run_with_timeout(
		[
			$self->_cli_command, '--cluster', 'create',
			(map { '127.0.0.1:' . $_->port } @nodes),
			'--cluster-replicas', 1, '--cluster-yes'
		],
		$opt{timeout} // 60);
	die "redis-cli --cluster create failed:\n$out\n$err" if $status != 0;

	my $deadline = time + ($opt{timeout} // 60);
	$self->wait_until_ok(timeout => $deadline - time);
	until (($self->check)[0])
	{
		die "redis-cli --cluster check does not pass:\n" . ($self->check)[1]
		  if time > $deadline;
		usleep(50_000);
	}

	# Masters in slot order, each replica after its master's place.
	my %node_info = $self->_nodes_info($nodes[0]);
	my (@masters, @replicas);
	foreach my $range (@RANGES)
	{
		my ($port) = grep {
			my $n = $node_info{$_};
			$n->{role} eq 'master' && grep { $_->[0] == $range->[0] && $_->[1] == $range->[1] }
			  @{ $n->{slots} }
		} keys %node_info;
		die "no master owns slots $range->[0]-$range->[1] after creation" unless $port;
		my ($replica) = grep {
			$node_info{$_}{role} eq 'slave' && $node_info{$_}{master_id} eq $node_info{$port}{id}
		} keys %node_info;
		die "master $port has no replica after creation" unless $replica;
		push @masters, $self->{by_port}{$port};
		push @replicas, $self->{by_port}{$replica};
	}
	$self->{masters} = \@masters;
	$self->{replicas} = \@replicas;
	$self->{all} = [ @masters, @replicas ];
	$self->{id}{$_} = $node_info{$_}{id} foreach keys %node_info;
	$self->{start_seconds} = time - $start;
	return $self;
}

sub masters { my $l = $_[0]->{masters}; return wantarray ? @$l : [@$l] }
sub replicas { my $l = $_[0]->{replicas}; return wantarray ? @$l : [@$l] }
sub nodes { my $l = $_[0]->{all}; return wantarray ? @$l : [@$l] }

# Seconds new took, from the first redis-server to the checked cluster.
sub start_seconds { return $_[0]->{start_seconds} }

sub node_for_port { return $_[0]->{by_port}{ $_[1] } }

sub replica_of
{
	my ($self, $master) = @_;
	foreach my $i (0 .. $#{ $self->{masters} })
	{
		return $self->{replicas}[$i] if $self->{masters}[$i] == $master;
	}
	die 'replica_of: not a master at creation';
}

sub url
{
	my ($self, %opt) = @_;
	my $userinfo = defined $opt{userinfo} ? "$opt{userinfo}\@" : '';
	return "redis://${userinfo}127.0.0.1:" . $self->{masters}[0]->port;
}

sub seeds_url
{
	my ($self, %opt) = @_;
	my $userinfo = defined $opt{userinfo} ? "$opt{userinfo}\@" : '';
	return "redis://$userinfo" . join(',', map { '127.0.0.1:' . $_->port } @{ $self->{masters} });
}

# The nodes that run (have a process), but those in except.
sub _running
{
	my ($self, @except) = @_;
	my %skip = map { $_->port => 1 } @except;
	return grep { $_->pid && !$skip{ $_->port } } @{ $self->{all} };
}

###
### Hash slots
###

my @crc16_table = map {
	my $crc = $_ << 8;
	$crc = ($crc & 0x8000) ? (($crc << 1) ^ 0x1021) : ($crc << 1) for 1 .. 8;
	$crc & 0xFFFF
} 0 .. 255;

# CRC16-XMODEM (polynomial 0x1021, initial 0), as Redis's crc16.c.
sub crc16
{
	my ($bytes) = @_;
	my $crc = 0;
	$crc = (($crc << 8) & 0xFF00) ^ $crc16_table[ (($crc >> 8) ^ $_) & 0xFF ]
	  foreach unpack('C*', $bytes);
	return $crc;
}

sub slot_of
{
	my ($self, $key) = @_;
	if (utf8::is_utf8($key))
	{
		$key = "$key";
		utf8::encode($key);
	}
	my $open = index($key, '{');
	if ($open >= 0)
	{
		my $close = index($key, '}', $open + 1);
		$key = substr($key, $open + 1, $close - $open - 1) if $close > $open + 1;
	}
	return crc16($key) & ($SLOTS - 1);
}

sub key_for_slot
{
	my ($self, $slot, $prefix) = @_;
	$prefix //= '';
	for (my $n = 0;; $n++)
	{
		return "$prefix$n" if $self->slot_of("$prefix$n") == $slot;
	}
}

# What node's CLUSTER NODES says: { nodes => { port => { id, flags, role
# (master/slave), master_id, slots [[first, last], ...] } }, myself => its own
# port }. (CLUSTER NODES, not CLUSTER SLOTS or SHARDS: their counts in INFO
# commandstats stay the clients'.)
sub _view
{
	my ($self, $node) = @_;
	my %view = (nodes => {});
	foreach my $line (split /\r?\n/, $self->call($node, 'CLUSTER', 'NODES'))
	{
		my ($id, $addr, $flags, $master_id, undef, undef, undef, undef, @slots) =
		  split ' ', $line;
		my ($port) = ($addr // '') =~ /:(\d+)@/ or next;
		# Single slots and ranges; not [slot->-id] (migrating) or [slot-<-id] (importing).
		my @ranges = map { /^(\d+)(?:-(\d+))?$/ ? [ $1, $2 // $1 ] : () } @slots;
		$view{nodes}{$port} = {
			id => $id,
			flags => $flags,
			role => $flags =~ /\bmaster\b/ ? 'master' : 'slave',
			master_id => $master_id,
			slots => \@ranges,
		};
		$view{myself} = $port if $flags =~ /\bmyself\b/;
	}
	return \%view;
}

# [ owner port of each slot (0: none) ] in a view.
sub _map_of_view
{
	my ($view) = @_;
	my @map = (0) x $SLOTS;
	while (my ($port, $n) = each %{ $view->{nodes} })
	{
		@map[ $_->[0] .. $_->[1] ] = ($port) x ($_->[1] - $_->[0] + 1) foreach @{ $n->{slots} };
	}
	return \@map;
}

# The slot layout of a view as a string ("first-last:port ..." in slot order),
# and how many slots have an owner.
sub _layout_of_view
{
	my ($view) = @_;
	my @ranges;
	while (my ($port, $n) = each %{ $view->{nodes} })
	{
		push @ranges, [ @$_, $port ] foreach @{ $n->{slots} };
	}
	my $count = 0;
	$count += $_->[1] - $_->[0] + 1 foreach @ranges;
	return (join(' ', map { "$_->[0]-$_->[1]:$_->[2]" } sort { $a->[0] <=> $b->[0] } @ranges),
		$count);
}

# [ owner port of each slot ] as node sees it.
sub _slot_map_of
{
	my ($self, $node) = @_;
	return _map_of_view($self->_view($node));
}

# The first running node that answers, and the result of code on it.
sub _ask_any
{
	my ($self, $code, @except) = @_;
	my @errors;
	foreach my $node ($self->_running(@except))
	{
		local $call_timeout = 3;
		my $result = eval { $code->($node) };
		return $result if defined $result;
		push @errors, $node->port . ": $@";
	}
	die "no node answers: @errors";
}

sub slot_map
{
	my ($self) = @_;
	return $self->_ask_any(sub { $self->_slot_map_of($_[0]) });
}

sub master_for_slot
{
	my ($self, $slot) = @_;
	my $port = $self->slot_map->[$slot] or die "no node owns slot $slot";
	return $self->{by_port}{$port} // die "slot $slot belongs to unknown port $port";
}

###
### Node state
###

sub node_id
{
	my ($self, $node) = @_;
	return $self->{id}{ $node->port } //= $self->call($node, 'CLUSTER', 'MYID');
}

sub role
{
	my ($self, $node) = @_;
	my $view = $self->_view($node);
	return $view->{nodes}{ $view->{myself} // die 'CLUSTER NODES without myself' }{role};
}

sub cluster_info
{
	my ($self, $node) = @_;
	return map { /^(\w+):(.*?)\r?$/ ? ($1, $2) : () } split /\n/,
	  $self->call($node, 'CLUSTER', 'INFO');
}

# port => { id, role, master_id, flags, slots } as node sees them (see _view).
sub _nodes_info
{
	my ($self, $node) = @_;
	return %{ $self->_view($node)->{nodes} };
}

sub _info_field
{
	my ($self, $node, $section, $pattern) = @_;
	my $info = $self->call($node, 'INFO', $section);
	return $info =~ $pattern ? $1 : undef;
}

sub errorstat
{
	my ($self, $node, $prefix) = @_;
	return $self->_info_field($node, 'errorstats', qr/^errorstat_\Q$prefix\E:count=(\d+)/m)
	  // 0;
}

sub total_errorstat
{
	my ($self, $prefix) = @_;
	my $total = 0;
	$total += $self->errorstat($_, $prefix) foreach $self->_running;
	return $total;
}

sub command_calls
{
	my ($self, $node, $command) = @_;
	return $self->_info_field($node, 'commandstats', qr/^cmdstat_\Q$command\E:calls=(\d+)/m)
	  // 0;
}

sub total_command_calls
{
	my ($self, $command, %opt) = @_;
	my $total = 0;
	foreach my $node ($self->_running)
	{
		next if $opt{masters_only} && $self->role($node) ne 'master';
		$total += $self->command_calls($node, $command);
	}
	return $total;
}

###
### Waiting
###

# Why the cluster, seen from the running nodes but except, is not ok yet (undef
# when it is). Options: except, sync, want (code given the agreed slot map,
# returning why not or undef).
sub _not_ok
{
	my ($self, %opt) = @_;
	local $call_timeout = 3;
	my @nodes = $self->_running(@{ $opt{except} // [] });
	return 'no node runs' unless @nodes;
	my ($first_view, $first_layout, $first_roles);
	foreach my $node (@nodes)
	{
		my $port = $node->port;
		my $not = eval {
			my %info = $self->cluster_info($node);
			return "$port: cluster_state:" . ($info{cluster_state} // '?')
			  if ($info{cluster_state} // '') ne 'ok';
			my $view = $self->_view($node);
			my ($layout, $covered) = _layout_of_view($view);
			return "$port: $covered slots covered" if $covered != $SLOTS;
			# Who is whose replica, among the running nodes.
			my %nodes = %{ $view->{nodes} };
			my %port_of = map { $nodes{$_}{id} => $_ } keys %nodes;
			my $roles = join ' ', map {
				my $n = $nodes{$_};
				!$n ? "$_:unknown"
				  : $n->{role} eq 'master' ? "$_:master"
				  : "$_:replica-of-" . ($port_of{ $n->{master_id} } // '?')
			} sort map { $_->port } @nodes;
			if (!$first_view)
			{
				($first_view, $first_layout, $first_roles) = ($view, $layout, $roles);
			}
			elsif ($layout ne $first_layout)
			{
				return "$port: another slot map than " . $nodes[0]->port;
			}
			elsif ($roles ne $first_roles)
			{
				return "$port: sees roles $roles, " . $nodes[0]->port . " $first_roles";
			}
			if ($opt{sync} // 1)
			{
				my $replication = $self->call($node, 'INFO', 'replication');
				return "$port: replica not in sync"
				  if $replication =~ /^role:slave/m
				  && $replication !~ /^master_link_status:up/m;
			}
			undef;
		};
		return "$port: $@" if $@;
		return $not if defined $not;
	}
	my $map = _map_of_view($first_view);
	my $not = $opt{want} ? $opt{want}->($map) : undef;
	$self->{last_map} = $map unless defined $not;
	return $not;
}

sub _wait
{
	my ($self, $what, %opt) = @_;
	my $start = time;
	my $deadline = $start + ($opt{timeout} // 30);
	while (defined(my $not = $self->_not_ok(%opt)))
	{
		die "$what: not after " . sprintf('%.1f', time - $start) . " s: $not\n" . $self->_dump
		  if time > $deadline;
		# Not at once: a slot is never without an owner for long otherwise.
		if (time - $start > 1 && time - ($self->{repair_checked} // 0) > 0.5)
		{
			$self->_repair_orphaned_slots(@{ $opt{except} // [] });
			$self->{repair_checked} = time;
		}
		usleep(20_000);
	}
	return time - $start;
}

# Gives a running master back (CLUSTER ADDSLOTS, with a diag) the slots it
# has no owner for that every other running node (but except) says it owns:
# what redis/redis#12564 leaves after a failover (see the top).
sub _repair_orphaned_slots
{
	my ($self, @except) = @_;
	local $call_timeout = 2;
	my @nodes = $self->_running(@except);
	foreach my $node (@nodes)
	{
		eval {
			my $own = $self->_slot_map_of($node);
			my @holes = grep { !$own->[$_] } 0 .. $SLOTS - 1;
			return unless @holes && $self->role($node) eq 'master';
			my @others = grep { $_ != $node } @nodes;
			my @maps = grep { $_ } map { my $n = $_; eval { $self->_slot_map_of($n) } } @others;
			return unless @maps;
			my $port = $node->port;
			my @orphans = grep {
				my $slot = $_;
				!grep { $_->[$slot] != $port } @maps
			} @holes;
			return unless @orphans;
			Test::More::diag("redis cluster: $port had lost slots @orphans that every other node says "
				  . "it owns (redis 7.0, redis/redis#12564); given back with CLUSTER ADDSLOTS");
			$self->call($node, 'CLUSTER', 'ADDSLOTS', @orphans);
			push @{ $self->{repaired} }, [ $port, @orphans ];
		};
	}
}

# The slots _repair_orphaned_slots gave back so far: [ [port, slots...], ... ].
sub repaired_slots { return @{ $_[0]->{repaired} // [] } }

# CLUSTER INFO's state and CLUSTER NODES of every running node, for a failure message.
sub _dump
{
	my ($self) = @_;
	local $call_timeout = 2;
	my $dump = '';
	foreach my $node ($self->_running)
	{
		my $state = eval { my %i = $self->cluster_info($node); "$i{cluster_state} epoch $i{cluster_current_epoch}" } // $@;
		my $nodes = eval { $self->call($node, 'CLUSTER', 'NODES') } // $@;
		$dump .= "node " . $node->port . " ($state) says:\n$nodes\n";
	}
	return $dump;
}

sub wait_until_ok
{
	my ($self, %opt) = @_;
	return $self->_wait('the cluster is not ok', %opt);
}

sub check
{
	my ($self) = @_;
	my ($node) = $self->_running or return (0, 'no node runs');
	my ($status, $out, $err) = RateLimitTest::Children::run_with_timeout(
		[ $self->_cli_command, '--cluster', 'check', '127.0.0.1:' . $node->port ], 30);
	my $passed = $status == 0 && $out !~ /\[ERR\]|\[WARNING\]/
	  && $out =~ /\[OK\] All $SLOTS slots covered/;
	return ($passed, "$out$err");
}

sub failover
{
	my ($self, $replica, %opt) = @_;
	my $start = time;
	my %info = $self->_nodes_info($replica);
	my $master_id = $info{ $replica->port }{master_id};
	my ($old_port) = grep { $info{$_}{id} eq $master_id } keys %info;
	die 'failover: ' . $replica->port . ' is not a replica' unless $old_port;
	my $old = $self->{by_port}{$old_port};
	# The master ignores a replica it does not know as its own yet (a replica
	# of a few milliseconds).
	if (!$opt{mode})
	{
		my $deadline = time + ($opt{timeout} // 30);
		until (eval {
				my %of_master = $self->_nodes_info($old);
				my $r = $of_master{ $replica->port };
				$r && $r->{role} eq 'slave' && $r->{master_id} eq $master_id
				  && $self->call($replica, 'INFO', 'replication') =~ /^master_link_status:up/m;
		})
		{
			die 'failover: ' . $old_port . ' does not know ' . $replica->port . ' as its replica'
			  if time > $deadline;
			usleep(20_000);
		}
	}
	$self->call($replica, 'CLUSTER', 'FAILOVER', $opt{mode} ? ($opt{mode}) : ());
	$self->_wait(
		'failover to ' . $replica->port,
		timeout => $opt{timeout},
		except => $old->pid ? [] : [$old],
		want => sub {
			my ($map) = @_;
			return 'it is not master yet' if $self->role($replica) ne 'master';
			return "the old master $old_port still owns slots" if grep { $_ == $old_port } @$map;
			return "the old master $old_port is not a replica yet"
			  if $old->pid && $self->role($old) ne 'slave';
			undef;
		});
	return time - $start;
}

sub wait_for_failover_of
{
	my ($self, $master, %opt) = @_;
	my $start = time;
	my $port = $master->port;
	# The slots it owns: as a running node says now, or as they last agreed.
	my $map = eval { $self->_ask_any(sub { $self->_slot_map_of($_[0]) }, $master) };
	my @owned = $map ? grep { $map->[$_] == $port } 0 .. $SLOTS - 1 : ();
	@owned = grep { $self->{last_map}[$_] == $port } 0 .. $SLOTS - 1 unless @owned;
	die "wait_for_failover_of: $port owns no slots" unless @owned;
	my $new;
	$self->_wait(
		"failover of $port",
		timeout => $opt{timeout},
		except => [$master],
		want => sub {
			my ($map) = @_;
			my %new_owners = map { $map->[$_] => 1 } @owned;
			return "$port still owns its slots" if $new_owners{$port};
			return "its slots went to several nodes" if keys %new_owners > 1;
			my ($new_port) = keys %new_owners;
			$new = $self->{by_port}{$new_port};
			return "the new owner $new_port is not master" if $self->role($new) ne 'master';
			undef;
		},
		sync => 0,
	);
	return wantarray ? ($new, time - $start) : $new;
}

###
### Moving slots
###

sub migration_begin
{
	my ($self, $slot, $to, $from) = @_;
	$from //= $self->master_for_slot($slot);
	die "slot $slot is already on " . $to->port if $from == $to;
	my $m = { slot => $slot, from => $from, to => $to, moved => 0 };
	$self->call($to, 'CLUSTER', 'SETSLOT', $slot, 'IMPORTING', $self->node_id($from));
	$self->call($from, 'CLUSTER', 'SETSLOT', $slot, 'MIGRATING', $self->node_id($to));
	return $m;
}

sub migration_keys
{
	my ($self, $m, %opt) = @_;
	my $pause = $opt{pause_between_keys};
	my $batch = $pause ? 1 : $opt{batch} // 100;
	my $left = $opt{count};
	my $moved = 0;
	my @auth = $self->{auth} ? ('AUTH2', @{ $self->{auth} }) : ();
	while (!defined $left || $left > 0)
	{
		my $n = defined $left && $left < $batch ? $left : $batch;
		my $keys = $self->call($m->{from}, 'CLUSTER', 'GETKEYSINSLOT', $m->{slot}, $n);
		last unless @$keys;
		my $reply = $self->call($m->{from}, 'MIGRATE', '127.0.0.1', $m->{to}->port, '', 0, 5000,
			($opt{replace} ? ('REPLACE') : ()), @auth, 'KEYS', @$keys);
		die "MIGRATE of slot $m->{slot}: $reply" unless $reply eq 'OK' || $reply eq 'NOKEY';
		$moved += @$keys;
		$m->{moved} += @$keys;
		$left -= @$keys if defined $left;
		$opt{on_batch}->($m->{slot}, $m->{moved}, $keys) if $opt{on_batch};
		usleep($pause * 1e6) if $pause;
	}
	return $moved;
}

sub migration_end
{
	my ($self, $m, %opt) = @_;
	my ($slot, $from, $to) = @$m{qw(slot from to)};
	my $to_id = $self->node_id($to);
	# The other masters, as the target sees them.
	my %nodes = $self->_nodes_info($to);
	my @others = grep {
		my $n = $nodes{ $_->port };
		$_ != $to && $_ != $from && $n && $n->{role} eq 'master' && $n->{flags} !~ /fail/
	} $self->_running;
	$self->call($_, 'CLUSTER', 'SETSLOT', $slot, 'NODE', $to_id) foreach $to, $from, @others;
	$self->_wait_owner([$slot], $to) if $opt{wait} // 1;
	return $m->{moved};
}

# Waits until every running node names to for every one of slots.
sub _wait_owner
{
	my ($self, $slots, $to, %opt) = @_;
	my $port = $to->port;
	$self->_wait(
		"slots moving to $port",
		timeout => $opt{timeout},
		sync => 0,
		want => sub {
			my ($map) = @_;
			my @not = grep { $map->[$_] != $port } @$slots;
			return @not ? scalar(@not) . " slots not on $port yet (first $not[0])" : undef;
		});
}

sub move_slot
{
	my ($self, $slot, $to, %opt) = @_;
	my $m = $self->migration_begin($slot, $to, delete $opt{from});
	$opt{on_migrating}->($slot, $m->{from}, $to) if $opt{on_migrating};
	$self->migration_keys($m, %opt);
	$opt{before_node}->($slot, $m->{from}, $to) if $opt{before_node};
	return $self->migration_end($m, wait => $opt{wait});
}

sub move_slots
{
	my ($self, $slots, $to, %opt) = @_;
	my $moved = 0;
	my $map = $self->slot_map;
	foreach my $slot (@$slots)
	{
		# A slot on $to already stays.
		next if $map->[$slot] == $to->port;
		my $from = $self->{by_port}{ $map->[$slot] } or die "no node owns slot $slot";
		$moved += $self->move_slot($slot, $to, %opt, wait => 0, from => $from);
	}
	$self->_wait_owner($slots, $to) if $opt{wait} // 1;
	return $moved;
}

###
### Commands
###

sub _cli_command
{
	my ($self) = @_;
	return ('redis-cli') unless $self->{auth};
	return ('redis-cli', '--user', $self->{auth}[0], '--pass', $self->{auth}[1], '--no-auth-warning');
}

# Our connection to node, made (and authenticated) if there is none for its
# process.
sub _conn
{
	my ($self, $node) = @_;
	my $port = $node->port;
	my $c = $self->{conns}{$port};
	return $c if $c && $c->{pid} == ($node->pid // -1);
	delete $self->{conns}{$port};
	my $sock = IO::Socket::INET->new(
		PeerAddr => '127.0.0.1',
		PeerPort => $port,
		Proto => 'tcp',
		Timeout => $call_timeout)
	  or die "cannot connect to 127.0.0.1:$port: $!";
	binmode $sock;
	$c = { sock => $sock, buf => '', pid => $node->pid // -1 };
	$self->{conns}{$port} = $c;
	$self->call($node, 'AUTH', @{ $self->{auth} }) if $self->{auth};
	return $c;
}

sub call
{
	my ($self, $node, @args) = @_;
	my $c = $self->_conn($node);
	my $reply = eval {
		my $deadline = time + $call_timeout;
		my $request = '*' . scalar(@args) . "\r\n";
		foreach my $arg (@args)
		{
			my $bytes = "$arg";
			utf8::encode($bytes) if utf8::is_utf8($bytes);
			$request .= '$' . length($bytes) . "\r\n$bytes\r\n";
		}
		while (length $request)
		{
			my $n = syswrite($c->{sock}, $request);
			die "write: $!" unless defined $n;
			substr($request, 0, $n) = '';
		}
		[ _read_reply($c, $deadline) ];
	};
	if (!$reply)
	{
		my $error = $@;
		delete $self->{conns}{ $node->port };
		die $node->port . " @args[0 .. ($#args < 1 ? $#args : 1)]: $error";
	}
	my ($value) = @$reply;
	die $node->port . " @args[0 .. ($#args < 1 ? $#args : 1)]: " . $value->message . "\n"
	  if ref $value eq 'RateLimitTest::Cluster::Error';
	return $value;
}

sub _fill
{
	my ($c, $deadline) = @_;
	my $left = $deadline - time;
	die "timeout\n" if $left <= 0 || !IO::Select->new($c->{sock})->can_read($left);
	my $n = sysread($c->{sock}, $c->{buf}, 65536, length $c->{buf});
	die "read: $!\n" unless defined $n;
	die "connection closed\n" if $n == 0;
}

sub _read_reply
{
	my ($c, $deadline) = @_;
	my $end;
	_fill($c, $deadline) while ($end = index($c->{buf}, "\r\n")) < 0;
	my $line = substr($c->{buf}, 0, $end + 2, '');
	my ($type, $rest) = (substr($line, 0, 1), substr($line, 1, -2));
	return $rest if $type eq '+';
	return $rest + 0 if $type eq ':';
	return bless { message => $rest }, 'RateLimitTest::Cluster::Error' if $type eq '-';
	if ($type eq '$')
	{
		return undef if $rest < 0;
		_fill($c, $deadline) while length($c->{buf}) < $rest + 2;
		my $data = substr($c->{buf}, 0, $rest + 2, '');
		return substr($data, 0, $rest);
	}
	if ($type eq '*')
	{
		return undef if $rest < 0;
		return [ map { _read_reply($c, $deadline) } 1 .. $rest ];
	}
	die "unexpected reply: $line";
}

sub stop_all
{
	my ($self) = @_;
	$self->{conns} = {};
	$_->stop foreach $self->_running;
}

package RateLimitTest::Cluster::Error;

sub message { return $_[0]->{message} }

1;
