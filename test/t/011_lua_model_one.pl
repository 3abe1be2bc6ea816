#!/usr/bin/perl
#
# The model tests of test/t/010_lua_model.pl, every one, against
# lua/token_bucket/take_one.lua: the lean script rl_consume runs for one bucket must
# give the same answers and leave the same state as take.lua, the group script.

use strict;
use warnings;

use FindBin;

$ENV{RL_TAKE_SCRIPT} = 'take_one.lua';
my $file = "$FindBin::Bin/010_lua_model.pl";
my $result = do $file;
die "cannot run $file: " . ($@ || $!) unless defined $result || !($@ || $!);
