#!/bin/sh
# What fits (core/train/fit.h), end to end on a tiny MLP of 6 blocks (random CSV data, CPU):
#   - --dry-run --device-memory prints the table of micro-batches × checkpointing with each plan's
#     peak and whether it fits, opening no data; a bad size is exit 2 naming the option;
#   - a run whose plan is over train.memory_limit_gb exits 1 before training, with the planned
#     breakdown and suggestions computed from the plan; under it, the run trains; one that runs
#     out in its first step (bf16 scratch the plan does not count) exits 1 with the plan and
#     choices that plan less;
#   - train_micro_batch_size_per_gpu "auto" picks from the plan under a limit, and exits 1 when
#     nothing fits.
# Usage: e2e_fit.sh BUILD_DIR.
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
scratch_dir

random_csv "$T/d.csv" 512 16 4 7
# micro: a number or "auto"
mlp() {
    cat >"$T/m.json" <<JSON
{"train_batch_size": 512, "train_micro_batch_size_per_gpu": $1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "model": {"input": [16], "loss": {"type": "cross_entropy"}, "layers": [
   {"type": "linear", "name": "in", "out": 128},
   {"type": "repeat", "times": 6, "layers": [
     {"type": "linear", "name": "fc", "out": 256}, {"type": "gelu", "name": "act"},
     {"type": "linear", "name": "proj", "out": 128}]},
   {"type": "linear", "name": "head", "out": 4}]},
 "data": {"train": {"format": "csv", "path": "d.csv"}},
 "train": {"device": "cpu", "max_steps": 2, "threads": 1, "epochs": 1}}
JSON
}
# run CODE DESCRIPTION ARGS...: ctrain ARGS exits CODE (stdout in $T/out, stderr in $T/err)
run() {
    want=$1 what=$2
    shift 2
    timeout 60 "$B" --config "$T/m.json" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$what"; else bad "$what (exit $rc, expected $want)"; sed 's/^/     /' "$T/err" | tail -6; fi
}

mlp 512
# the dry run plans for another device without opening data: the data file is gone for it
mv "$T/d.csv" "$T/d.keep"
run 0 "--dry-run --device-memory 12MiB: exit 0" --dry-run --device-memory 12MiB
has "$T/err" "what fits in 12.0 MiB (--device-memory)" "the table names the budget and where it came from"
has "$T/err" "micro  accum  checkpointing" "the table has its header"
has "$T/err" "^ *256 *2  as configured: off  *10.2 MiB  yes" "micro-batch 256 with accumulation 2 fits"
has "$T/err" "^ *512 *1  as configured: off  *14.4 MiB  no   <- this config" "the configured run does not (planned for a device: the loader's device batches count)"
has "$T/err" "^ *512 *1  every block (6 segments)  *10.6 MiB  yes" "every block checkpointed at 512 fits"
has "$T/err" "^ *1 *512  every block" "the micro-batches halve down to 1"
has "$T/err" "data not opened" "no data opened"
run 2 "--device-memory 24: no unit, exit 2" --dry-run --device-memory 24
has "$T/err" "\-\-device-memory: \"24\" has no unit" "the message names the option and the problem"
run 2 "--device-memory -1GiB: exit 2" --dry-run --device-memory=-1GiB
run 2 "--device-memory without --dry-run: exit 2" --device-memory 12MiB
has "$T/err" "needs --dry-run" "the message says what it is for"
mv "$T/d.keep" "$T/d.csv"

run 1 "a plan over train.memory_limit_gb: exit 1 before training" --set train.memory_limit_gb=0.0117 --set train.run_dir="$T/r1"
has "$T/err" "the memory plan needs 14.3 MiB but train.memory_limit_gb 0.0117 allows 12.0 MiB" "the message names the limit"
has "$T/err" "planned: params 0 B, master 1.5 MiB, grads 1.5 MiB, optim 3.0 MiB, activations 8.3 MiB" "with the planned breakdown"
has "$T/err" "micro-batch 256 with gradient accumulation 2 fits in 10.2 MiB" "a smaller micro-batch that fits"
has "$T/err" "or checkpoint every block (activation_checkpointing.number_checkpoints 6): 10.6 MiB at micro-batch 512" "or checkpointing"
has "$T/out" '"status":"error"' "the summary says error"
run 0 "the suggestion taken: it trains" --set train.memory_limit_gb=0.0117 --set train.run_dir="$T/r2" \
    --set activation_checkpointing.number_checkpoints=6
# bf16 on the CPU: the plan fits, the fp32 copies of 16-bit arguments it does not count do not
run 1 "bf16 past train.memory_limit_gb in the first step: exit 1" --set bf16.enabled=true \
    --set train.memory_limit_gb=0.0115 --set train.run_dir="$T/r5"
has "$T/err" "out of host memory allocating" "the allocation that failed"
has "$T/err" "planned: params 777.8 KiB.* did not fit in the 818.6 KiB left" "the plan and what was left"
has "$T/err" "micro-batch 256 with gradient accumulation 2 fits in 8.9 MiB" "a choice that plans less"

mlp '"auto"'
run 0 "micro-batch auto under a limit: trains" --set train.memory_limit_gb=0.0075 --set train.run_dir="$T/r3"
has "$T/err" "batch  512 = micro 32 × accumulation 16 × world 1" "the largest micro-batch within 90% of the limit"
has "$T/err" "micro-batch \"auto\": 32 × accumulation 16" "the start block says what was chosen and why"
run 1 "micro-batch auto when nothing fits: exit 1" --set train.memory_limit_gb=0.005 --set train.run_dir="$T/r4"
has "$T/err" "not even micro-batch 1 fits" "the message says so"
has "$T/err" "nothing fits in" "and what the model's fixed part needs"
run 0 "micro-batch auto without a limit: the batch rule" --dry-run
has "$T/err" "no memory limit is known" "the start block says no limit was known"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
