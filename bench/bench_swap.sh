#!/bin/sh
# bench_swap.sh: the NVMe swap engine's throughput on one directory's disk (docs/BENCHMARKS.md,
# "NVMe swap engine"): bench/bench_swap.c over a grid of block sizes, queue depths and threads,
# plain buffered I/O once, and dd with and without O_DIRECT on the same disk.
# Usage: sh bench/bench_swap.sh BUILD DIR [MIB]   (BUILD/libctrain.a built first; DIR on the disk)
set -eu
B=${1:?usage: bench_swap.sh BUILD DIR [MIB]}
D=${2:?usage: bench_swap.sh BUILD DIR [MIB]}
MIB=${3:-1024}
T=$(mktemp -d)
trap 'rm -rf "$T"; rm -f "$D/bench_dd.$$"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I. bench/bench_swap.c "$B/libctrain.a" -lm -ldl -pthread -lz -o "$T/bench_swap"
"$T/bench_swap" "$D" "$MIB" 1024 8 1 buffered
for qd in 1 4 32; do "$T/bench_swap" "$D" "$MIB" 1024 "$qd" 1; done
"$T/bench_swap" "$D" "$MIB" 256 8 1
"$T/bench_swap" "$D" "$MIB" 4096 8 1
"$T/bench_swap" "$D" "$MIB" 1024 8 2
echo "# dd, 1 MiB blocks"
dd if=/dev/zero of="$D/bench_dd.$$" bs=1M count="$MIB" oflag=direct 2>&1 | sed -n 's/^/dd write O_DIRECT: /p' | tail -1
dd if="$D/bench_dd.$$" of=/dev/null bs=1M iflag=direct 2>&1 | sed -n 's/^/dd read O_DIRECT: /p' | tail -1
rm -f "$D/bench_dd.$$"
dd if=/dev/zero of="$D/bench_dd.$$" bs=1M count="$MIB" conv=fdatasync 2>&1 | sed -n 's/^/dd write buffered + fdatasync: /p' | tail -1
