#!/bin/sh
# End-to-end: the flops profiler (flops_profiler) on a random CSV data set and a small MLP with a
# repeated block, gradient accumulation (2 micro-batches a step) and a checkpointed layer (its
# recompute pass counts as backward):
#  - output_file: the table is written there (one line on stderr says so); its rows add up to the
#    total row; the total's params are the model's, its forward FLOPs the layers' count x samples;
#    every linear layer was timed in forward and backward;
#  - no output_file: the table on stderr; --quiet: nothing;
#  - module_depth 1 groups a repeat's layers by name (fc.0, fc.1 -> fc), detailed false prints
#    the total row alone, top_modules N names N modules;
#  - with wall_clock_breakdown the breakdown stays finite (the profiled step is left out of it);
#  - profile_step past the run: a warning; an output_file that cannot be written: exit 2 naming
#    the key.
# Usage: e2e_profile.sh BUILD_DIR
set -u
. test/lib_e2e.sh
in_scratch "${1:-build}"

random_csv train.csv 256 16 4 7
random_csv eval.csv 64 16 4 8
# 16 -> 24 -> (24 -> 24, relu) x 2 -> 4: params 16*24+24 + 2*(24*24+24) + 24*4+4 = 1708
cat > run.json <<'JSON'
{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "model": {"input": [16], "layers": [{"type": "linear", "name": "inp", "out": 24, "checkpoint": true},
           {"type": "repeat", "times": 2, "layers": [{"type": "linear", "name": "fc", "out": 24},
                                                      {"type": "relu", "name": "act"}]},
           {"type": "linear", "name": "head", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}},
 "train": {"epochs": 1, "seed": 3, "device": "cpu", "threads": 1}}
JSON

# --- the table in output_file ---
"$B" --config run.json --set train.run_dir=r1 \
    --set 'flops_profiler={"enabled": true, "profile_step": 3, "output_file": "prof.txt"}' >out 2>err ||
    bad "profile run: exit $?"
has err '^flops profiler: step 3 written to prof.txt' "stderr says where the profile went"
if grep -q '^  total ' err; then bad "the table went to stderr as well"; else ok "the table is in the file only"; fi
has prof.txt '^flops profiler: step 3, 32 samples, ' "header: the step and its samples"
# rows (every line with 8+ fields whose 3rd is an integer) against the total row
awk '
    $1 == "layer" { next }
    NF >= 9 && $3 ~ /^[0-9]+$/ {
        if ($1 == "total") { tp = $3; tf = $4; tfw = $5; tbw = $6; ttot = $7; ts = $8; have = 1; next }
        n++; p += $3; f += $4; fw += $5; bw += $6; tot += $7; s += $8
        if ($2 == "linear" && !($5 > 0 && $6 > 0)) untimed = untimed " " $1
    }
    END {
        bad = 0
        if (!have) { print "no total row"; exit 1 }
        if (n != 6) { print "rows:", n; bad = 1 }
        if (p != tp) { print "params", p, "total", tp; bad = 1 }
        if (p != 1708) { print "params", p, "expected 1708"; bad = 1 }
        if (f - tf > 1e-5 * tf || tf - f > 1e-5 * tf) { print "flops", f, "total", tf; bad = 1 }
        # forward FLOPs: 2 x multiply-adds of the linears (+ relu counted by its layer) x 32 samples
        if (tf < 32 * 2 * (16*24 + 2*24*24 + 24*4)) { print "flops below the linears", tf; bad = 1 }
        if (fw - tfw > 0.01 || tfw - fw > 0.01) { print "fwd ms", fw, "total", tfw; bad = 1 }
        if (bw - tbw > 0.01 || tbw - bw > 0.01) { print "bwd ms", bw, "total", tbw; bad = 1 }
        if (tot - ttot > 0.01 || ttot - tot > 0.01) { print "ms", tot, "total", ttot; bad = 1 }
        if (s - ts > 0.5 || ts - s > 0.5) { print "share", s, "total", ts; bad = 1 }
        if (ts + 0 > 100.05) { print "layers over the step:", ts; bad = 1 }
        if (untimed != "") { print "untimed:" untimed; bad = 1 }
        exit bad
    }' prof.txt >sums 2>&1 && ok "rows add up to the total; params 1708; every linear layer timed" ||
    { bad "table sums: $(cat sums)"; sed 's/^/     /' prof.txt; }
has prof.txt '^outside the layers (data wait, loss, optimizer, host work): ' "the step's time outside the layers"
has prof.txt '^top 1 module by time: ' "top_modules default 1"
has prof.txt '^model: .* FLOPs a training step, .* MFU not reported' "model FLOPs, no MFU on a CPU"
has out '"status":"ok"' "the profiled run finishes"

# --- on stderr, grouped, not detailed; --quiet ---
"$B" --config run.json --set train.run_dir=r2 --set wall_clock_breakdown=true --set steps_per_print=2 \
    --set 'flops_profiler={"enabled": true, "profile_step": 2, "module_depth": 1, "detailed": false, "top_modules": 3}' \
    >out 2>err || bad "grouped run: exit $?"
has err '^flops profiler: step 2, 32 samples' "no output_file: the table on stderr"
has err '^  total ' "the total row"
if grep -q '^  fc ' err; then bad "detailed false printed rows"; else ok "detailed false: the total row alone"; fi
has err '^top 3 modules by time: .*fc [0-9.]* ms' "module_depth 1: the repeat's fc.0 and fc.1 are one module fc"
if grep -q '^time (ms) per step.*nan' err; then bad "breakdown has NaN after the profiled step"; else
    ok "the breakdown stays finite"; fi
has err '^time (ms) per step, mean of steps 1-2 (step 2 profiled, left out): ' \
    "the breakdown's window says it left the profiled step out"
"$B" --quiet --config run.json --set train.run_dir=r3 --set 'flops_profiler={"enabled": true}' >out 2>err ||
    bad "quiet run: exit $?"
eq "--quiet: nothing on stderr" "$(wc -c <err | tr -d ' ')" 0

# --- refusals and warnings ---
"$B" --config run.json --set train.run_dir=r4 --set 'flops_profiler={"enabled": true, "profile_step": 99}' \
    >out 2>err || bad "late profile_step: exit $?"
has err "warning: flops_profiler.profile_step 99 is past the run's 8 steps: no profile" "profile_step past the run"
"$B" --config run.json --set train.run_dir=r5 \
    --set 'flops_profiler={"enabled": true, "output_file": "no/such/dir/p.txt"}' >out 2>err
eq "unwritable output_file: exit 2" "$?" 2
has err 'flops_profiler.output_file "no/such/dir/p.txt": No such file or directory' "the error names the key and file"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
