#!/bin/sh
# bench_logging.sh: what metrics.jsonl + TensorBoard + csv_monitor + wall_clock_breakdown cost a
# step of the Fashion-MNIST MLP (issue 16: "< 1% of step time"), in one run:
#  1. bench/bench_logging.c: the CPU time the metric files take per step (the training thread's
#     queueing, the writer thread's formatting and writes), at every step and at the MLP's
#     default print interval (50);
#  2. configs/fmnist_mlp.json, one epoch with every output on, 3 runs: the step's CPU time
#     (user + system of the process / steps: what the logging competes with when every core
#     trains) and its wall time (1 / steps per second);
#  3. the ratio of 1 to 2 for each cadence.
# CPU time is the figure because it is steady on a shared machine; see bench_logging.c.
# Usage: bench/bench_logging.sh [BUILD_DIR]   (needs Fashion-MNIST in /usr/share/datasets)
set -eu
B=${1:-build}
[ -f "$B/libctrain.a" ] && [ -x "$B/ctrain" ] || { echo "bench_logging: build $B first (make)" >&2; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cc -O2 -std=c11 -D_GNU_SOURCE -I. bench/bench_logging.c "$B/libctrain.a" -lm -ldl -pthread -lz -o "$T/bench_logging"
"$T/bench_logging" 5000 200 >"$T/logging.jsonl"
cat "$T/logging.jsonl"

for r in 1 2 3; do
    /usr/bin/time -f "%U %S" -o "$T/time$r" "$B/ctrain" --config configs/fmnist_mlp.json --quiet \
        --set train.epochs=1 --set checkpoint.enabled=false --set train.eval_interval=0 \
        --set "train.run_dir=\"$T/run$r\"" \
        --set wall_clock_breakdown=true \
        --set 'tensorboard={"enabled": true, "output_path": "", "job_name": "tb"}' \
        --set 'csv_monitor={"enabled": true, "output_path": "", "job_name": "csv"}' >"$T/sum$r"
done
/usr/bin/python3 - "$T" <<'PY'
import json, sys, os
T = sys.argv[1]
log = [json.loads(l) for l in open(os.path.join(T, "logging.jsonl"))]
cpu, wall = [], []
for r in (1, 2, 3):
    s = json.load(open(os.path.join(T, "sum%d" % r)))
    user, system = map(float, open(os.path.join(T, "time%d" % r)).read().split()[-2:])
    cpu.append(1e6 * (user + system) / s["steps"])
    wall.append(1e6 * s["hparams"]["train_batch_size"] / s["samples_per_s"])
cpu.sort(); wall.sort()
step_cpu, step_wall = cpu[1], wall[1]
print(json.dumps({"mlp_step_cpu_us_median": round(step_cpu, 1), "mlp_step_wall_us_median": round(step_wall, 1),
                  "runs_cpu_us": [round(c, 1) for c in cpu], "runs_wall_us": [round(w, 1) for w in wall]}))
for l in log:
    print(json.dumps({"every": l["every"], "logging_cpu_us": l["cpu_us_per_step_median"],
                      "share_of_step_cpu": round(l["cpu_us_per_step_median"] / step_cpu, 5),
                      "share_of_step_wall": round(l["cpu_us_per_step_median"] / step_wall, 5)}))
PY
