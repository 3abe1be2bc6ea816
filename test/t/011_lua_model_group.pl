#!/usr/bin/perl
#
# The model tests of test/t/010_lua_model.pl, every one, against lua/group.lua, the
# script of rl_consume_all: one token-bucket check of it must give the same answers and
# leave the same state as take_one.lua, the lean script rl_consume runs.

use strict;
use warnings;

use FindBin;

$ENV{RL_TAKE_SCRIPT} = 'group.lua';
my $file = "$FindBin::Bin/010_lua_model.pl";
my $result = do $file;
die "cannot run $file: " . ($@ || $!) unless defined $result || !($@ || $!);
