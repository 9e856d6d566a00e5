#!/bin/sh
# bench_overlap.sh: what overlap_comm and stage 3's prefetch buy on this machine (issue 15): the
# step time of `mpirun -np 2` on an MLP of 3.2 M parameters (1024-1024-1024-1024-10, fp32, micro-
# batch 32, no accumulation, one thread per rank, 40 steps), whose gradient reduction (12.6 MB per
# step) takes about as long as its compute or longer, at ZeRO stages 0, 2 and 3, each without and
# with overlap (stage 3: without overlap, prefetch and reuse, then with all three, its default).
# ROUNDS rounds (default 3), the
# configurations interleaved in each, so a change in the machine's load hits them alike; per
# configuration the median and the best of the step times (the summary's train_batch_size /
# samples_per_s, which leaves out start-up), the medians of wall_clock_breakdown's backward and
# optimizer phases over steps 21-40 (the optimizer phase holds the wait for the gradient reduction
# that backward did not finish) and the weights compared bit for bit with the run without overlap.
# Usage: bench/bench_overlap.sh [BUILD_DIR] [ROUNDS]
set -eu
B=${1:-build}
ROUNDS=${2:-3}
[ -x "$B/ctrain" ] && [ -f "$B/libctrain_mpi.so" ] || { echo "bench_overlap: build $B first (make)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2"
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # no CMA in containers without ptrace
awk 'BEGIN { srand(5); for (f = 0; f < 1024; f++) printf "x%d,", f; print "label";
             for (r = 0; r < 512; r++) { for (f = 0; f < 1024; f++) printf "%.3f,", 2 * rand() - 1; print int(rand() * 10) } }' \
    >"$T/train.csv"
cat >"$T/mlp.json" <<EOF
{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 32,
 "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}},
 "model": {"input": [1024], "layers": [{"type": "linear", "out": 1024}, {"type": "relu"},
           {"type": "linear", "out": 1024}, {"type": "relu"}, {"type": "linear", "out": 1024}, {"type": "relu"},
           {"type": "linear", "out": 10}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "workers": 1},
 "zero_optimization": {"reduce_bucket_size": 1000000, "stage3_param_persistence_threshold": 0},
 "train": {"max_steps": 40, "seed": 1, "device": "cpu", "threads": 1, "save_interval": 40}}
EOF
# name stage overlap prefetch reuse
CONFIGS="z0 0 false 0 0
z0_overlap 0 true 0 0
z2 2 false 0 0
z2_overlap 2 true 0 0
z3 3 false 0 0
z3_overlap_prefetch 3 true 50000000 1000000000"
echo "load before: $(cat /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
    echo "$CONFIGS" | while read -r name stage overlap prefetch reuse; do
        $MPIRUN "$B/ctrain" --config "$T/mlp.json" --set steps_per_print=20 --set wall_clock_breakdown=true \
            --set zero_optimization.stage=$stage \
            --set zero_optimization.overlap_comm=$overlap --set zero_optimization.stage3_prefetch_bucket_size=$prefetch \
            --set zero_optimization.stage3_max_reuse_distance=$reuse \
            --set "train.run_dir=\"$T/$name.$round\"" </dev/null >"$T/$name.$round.out" 2>"$T/$name.$round.err" ||
            { echo "$name failed"; tail -3 "$T/$name.$round.err"; exit 1; }
    done
done
echo "load after: $(cat /proc/loadavg)"
/usr/bin/python3 - "$T" "$ROUNDS" <<'PY'
import filecmp, json, re, statistics, sys
t, rounds = sys.argv[1], int(sys.argv[2])
def phases(path):   # wall_clock_breakdown's last window (steps 21-40), rank 0's: backward, optimizer
    line = [l for l in open(path) if l.startswith("time (ms) per step")][-1]
    return [float(re.search(k + r" ([0-9.]+)", line).group(1)) for k in ("backward", "optimizer")]
names = ["z0", "z0_overlap", "z2", "z2_overlap", "z3", "z3_overlap_prefetch"]
ms = {}
for n in names:
    ms[n] = sorted(64 / json.loads(open(f"{t}/{n}.{r}.out").read().strip().splitlines()[-1])["samples_per_s"] * 1000
                   for r in range(1, rounds + 1))
for n in names:
    base = n.split("_")[0]
    same = all(filecmp.cmp(f"{t}/{base}.{r}/checkpoints/global_step40/model.safetensors",
                           f"{t}/{n}.{r}/checkpoints/global_step40/model.safetensors", shallow=False)
               for r in range(1, rounds + 1))
    ph = [phases(f"{t}/{n}.{r}.err") for r in range(1, rounds + 1)]
    print(json.dumps({"config": n, "step_ms_median": round(statistics.median(ms[n]), 2), "step_ms_best": round(ms[n][0], 2),
                      "backward_ms_median": round(statistics.median(p[0] for p in ph), 2),
                      "optimizer_ms_median": round(statistics.median(p[1] for p in ph), 2),
                      "vs_without_median": round(statistics.median(ms[n]) / statistics.median(ms[base]), 3),
                      "weights_as_without": same}))
PY
