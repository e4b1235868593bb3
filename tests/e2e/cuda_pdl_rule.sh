#!/bin/bash
# The programmatic-dependent-launch rule of the CUDA backend (the header of
# kernels/cuda/cu_pdl.cuh), checked on the sources so that it holds on
# machines without a GPU too:
#   1. only cu_pdl.cuh launches with the PDL attribute (cudaLaunchKernelEx
#      and the attribute's name appear in no other file);
#   2. every kernel launched through mr_cu_launch calls mr_pdl_wait() in its
#      body, and before any return in it (a kernel launched with the
#      attribute that does not wait reads and writes while the kernel before
#      it still runs).
# Comments are stripped first.  Plain <<<>>> launches are listed: they need
# no wait.
set -euo pipefail
cd "$(dirname "$0")/../.."
perl - kernels/cuda/*.cu kernels/cuda/*.cuh <<'EOF'
use strict;
use warnings;
my (%src, $fail);
for my $f (@ARGV) {
    local $/;
    open(my $h, '<', $f) or die "$f: $!";
    my $t = <$h>;
    $t =~ s{/\*.*?\*/}{ my $c = $&; $c =~ s/[^\n]//g; $c }gse; # keep line count
    $t =~ s{//[^\n]*}{}g;
    $src{$f} = $t;
}
# 1. the attribute only in the helper
for my $f (sort keys %src) {
    next if $f =~ m{/cu_pdl\.cuh$};
    if ($src{$f} =~ /cudaLaunchKernelEx|ProgrammaticStreamSerialization/) {
        print "FAIL: $f launches with cudaLaunchKernelEx / the PDL attribute outside cu_pdl.cuh\n";
        $fail = 1;
    }
}
# 2. the kernels launched through mr_cu_launch
my %launched;
for my $f (sort keys %src) {
    next if $f =~ m{/cu_pdl\.cuh$};
    while ($src{$f} =~ /\bmr_cu_launch\s*\(\s*[^,]+,\s*(\w+)/g) {
        $launched{$1} .= "$f ";
    }
}
my %body;
for my $f (sort keys %src) {
    my $t = $src{$f};
    while ($t =~ /__global__\s+void\s+(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(/g) {
        my ($name, $p) = ($1, pos($t));
        my $depth = 1; # the parameter list
        while ($depth > 0 && $p < length $t) {
            my $ch = substr($t, $p++, 1);
            $depth++ if $ch eq '(';
            $depth-- if $ch eq ')';
        }
        my $open = index($t, '{', $p);
        my $semi = index($t, ';', $p);
        next if $open < 0 || ($semi >= 0 && $semi < $open); # a declaration
        $depth = 1;
        my $q = $open + 1;
        while ($depth > 0 && $q < length $t) {
            my $ch = substr($t, $q++, 1);
            $depth++ if $ch eq '{';
            $depth-- if $ch eq '}';
        }
        $body{$name} = substr($t, $open, $q - $open);
    }
}
my $n = 0;
for my $k (sort keys %launched) {
    $n++;
    my $b = $body{$k};
    if (!defined $b) {
        print "FAIL: kernel $k (launched by mr_cu_launch in $launched{$k}) has no definition found\n";
        $fail = 1;
        next;
    }
    my $w = index($b, 'mr_pdl_wait()');
    if ($w < 0) {
        print "FAIL: kernel $k is launched by mr_cu_launch but never calls mr_pdl_wait()\n";
        $fail = 1;
        next;
    }
    if ($b =~ /\breturn\b/ && $-[0] < $w) {
        print "FAIL: kernel $k can return before its first mr_pdl_wait()\n";
        $fail = 1;
    }
}
my %plain;
for my $f (sort keys %src) {
    while ($src{$f} =~ /\b(\w+)\s*(?:<[^<>;]*>)?\s*<<</g) { $plain{$1} = 1; }
}
printf "%d kernels launched through mr_cu_launch, all waiting%s; plain <<<>>> launches: %s\n", $n,
    $fail ? " (NOT: see above)" : "", join(' ', sort keys %plain) || "none";
exit($fail ? 1 : 0);
EOF
