#!/bin/sh
# End-to-end training runs on the CPU: Fashion-MNIST MLP and CNN for a few hundred steps, the
# summary JSON, --dry-run, and the exit codes of bad data (every record skipped as corrupt too),
# divergence and SIGINT.
# Usage: e2e_train.sh BUILD_DIR. Fails, naming it, when the Fashion-MNIST package is missing (make deps
# installs it).
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
need_fmnist
scratch_dir
# run CODE DESCRIPTION ARGS...: run ctrain --quiet --summary $T/s.json ARGS, check the exit code
run() {
    code=$1; what=$2; shift 2
    rm -f "$T/s.json"
    runs=$((${runs:-0} + 1))   # a run directory per config: ctrain refuses one holding another's run
    "$B" --quiet --summary "$T/s.json" --set train.run_dir="$T/r$runs" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$what"; else bad "$what (exit $rc, expected $code)"; sed 's/^/     /' "$T/err" | head -5; fi
}
# summary EXPR DESCRIPTION: a Python expression over the summary dict s must be true
summary() {
    if python3 -c "import json,sys; s=json.load(open('$T/s.json')); sys.exit(0 if ($1) else 1)" 2>/dev/null; then
        ok "$2"
    else
        bad "$2: $(cat "$T/s.json" 2>/dev/null || echo 'no summary')"
    fi
}

# MLP: 300 steps (0.64 epoch), eval on 2000 test images.
run 0 "fmnist_mlp trains" --config configs/fmnist_mlp.json --set train.max_steps=300 \
    --set data.eval.limit=2000
summary "s['status'] == 'ok' and s['steps'] == 300 and s['epochs'] == 1" "mlp summary: status, steps, epochs"
summary "s['eval_accuracy'] > 0.80 and s['eval_loss'] < 0.6" "mlp accuracy > 80% after 300 steps"
summary "s['train_loss'] < 0.8 and s['samples_per_s'] > 0 and s['peak_host_bytes'] > 0" "mlp summary numbers"
summary "s['first_step_s'] is not None and s['first_step_s'] < 5" "mlp first step time recorded"
summary "s['tokens_per_s'] is None and s['loss_scale'] is None" "mlp: absent metrics are null"
has "$T/out" '^{"status":"ok"' "summary line on stdout"

# CNN: 50 steps (still in the LR warm-up) with gradient accumulation (micro 64 x 2).
run 0 "fmnist_cnn trains with accumulation" --config configs/fmnist_cnn.json --set train.max_steps=50 \
    --set train_micro_batch_size_per_gpu=64 --set gradient_accumulation_steps=2 --set data.eval.limit=1000
summary "s['status'] == 'ok' and s['steps'] == 50 and s['eval_accuracy'] > 0.60" "cnn accuracy > 60% after 50 steps"

# The memory summary, and the GPU-only switches on the CPU: cuda_graph true is a notice (the CPU
# cannot capture), on_device changes nothing (same losses bit for bit), a bad value is a config error.
run 0 "cnn trains 20 steps" --config configs/fmnist_cnn.json --set train.max_steps=20 \
    --set data.eval.limit=500
summary "s['peak_bytes_by_category']['activations'] > 0 and s['peak_bytes_by_category']['optim'] > 0" "summary has memory per category"
cp "$T/s.json" "$T/plain.json"
"$B" --config configs/fmnist_mlp.json --set train.max_steps=2 --set data.eval.limit=100 \
    --set train.run_dir="$T/run-mem" --set memory_breakdown=true >"$T/out" 2>"$T/err"
has "$T/err" "peak host memory (MiB): params" "memory_breakdown prints the categories"
run 0 "cuda_graph true on the CPU runs" --config configs/fmnist_cnn.json --set train.max_steps=20 \
    --set data.eval.limit=500 --set train.cuda_graph=true --set data.transform.on_device=true
has "$T/err" "cannot capture steps" "cuda_graph true on the CPU is a notice"
if python3 -c "import json,sys; a=json.load(open('$T/plain.json')); b=json.load(open('$T/s.json')); sys.exit(0 if a['train_loss'] == b['train_loss'] and a['eval_loss'] == b['eval_loss'] else 1)"; then
    ok "on_device and cuda_graph change nothing on the CPU"
else
    bad "on_device or cuda_graph changed the CPU run"
fi
run 2 "train.cuda_graph \"sometimes\" is a config error" --config configs/fmnist_cnn.json --set train.cuda_graph=sometimes
has "$T/err" "train.cuda_graph" "the error names train.cuda_graph"

# Dry run: the plan, nothing trained.
"$B" --config configs/fmnist_mlp.json --dry-run >"$T/out" 2>"$T/err"
[ $? -eq 0 ] && ok "--dry-run exits 0" || bad "--dry-run exit code"
has "$T/err" "batch  128 = micro 128 × accumulation 1 × world 1" "dry run prints the batch arithmetic"
has "$T/err" "memory plan: params" "dry run prints the memory plan"
has "$T/err" "669.7 k params" "dry run prints the parameter count"

# A truncated images file: data error naming the file and the offset.
head -c 100000 "$D/train-images-idx3-ubyte.gz" >"$T/train-images.gz"
cat >"$T/bad.json" <<EOF
{"train_batch_size": 16, "optimizer": {"type": "Adam", "params": {}},
 "model": {"input": [1, 28, 28], "layers": [{"type": "flatten"}, {"type": "linear", "out": 10}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "idx", "images": "train-images.gz",
                    "labels": "$D/train-labels-idx1-ubyte.gz"}}}
EOF
run 3 "truncated IDX file exits 3" --config "$T/bad.json"
has "$T/err" "train-images.gz: truncated at byte offset" "truncated file named with its offset"
summary "s['status'] == 'error' and 'truncated' in s.get('error', '')" "summary written on data error"

# data.skip_corrupt with every record corrupt trains nothing: exit 3 naming the data, no checkpoint
# (it ended "ok", exit 0, train_loss null, with a checkpoint of the initial weights); an eval set
# whose every record is corrupt has no eval loss: exit 3 too.
for c in a b; do mkdir -p "$T/junk/$c"; for i in 1 2 3 4; do head -c 300 /dev/urandom >"$T/junk/$c/$i.png"; done; done
cat >"$T/junk.json" <<EOF
{"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {}},
 "model": {"input": [1, 8, 8], "layers": [{"type": "flatten"}, {"type": "linear", "out": 2}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "image_folder", "root": "junk", "size": [8, 8], "channels": 1},
          "skip_corrupt": true},
 "train": {"max_steps": 6}}
EOF
run 3 "skip_corrupt, every record corrupt: exit 3" --config "$T/junk.json"
has "$T/err" "data.train (.*/junk): every record of epoch 1 was skipped as corrupt" "the message names the data and says why"
summary "s['status'] == 'error' and s['skipped_records'] == 8" "summary status error, 8 records skipped"
if ls -d "$T/r$runs/checkpoints/global_step"* >/dev/null 2>&1; then bad "a checkpoint was saved of nothing trained"; else ok "no checkpoint saved"; fi
run 3 "skip_corrupt, one step of corrupt records: exit 3" --config "$T/junk.json" --set train.max_steps=1
has "$T/err" "every record read in this run's 1 step was skipped" "the message says the run's steps read nothing"
run 3 "skip_corrupt, an eval set of corrupt records: exit 3" --config configs/fmnist_mlp.json --set train.max_steps=2 \
    --set 'data.eval={"format": "image_folder", "root": "'"$T"'/junk", "size": [28, 28], "channels": 1}' --set data.skip_corrupt=true
has "$T/err" "data.eval (.*junk): every record of the eval set was skipped as corrupt" "the message names the eval set"

# Divergence: NaN loss exits 4 with status diverged.
run 4 "divergence exits 4" --config configs/fmnist_mlp.json --set optimizer.params.lr=1e30 \
    --set train.max_steps=50
summary "s['status'] == 'diverged'" "summary status diverged"
has "$T/err" "diverged" "divergence message"

# SIGINT stops after the current step: exit 130, status interrupted.
"$B" --config configs/fmnist_mlp.json --summary "$T/s.json" --set steps_per_print=1 --set train.run_dir="$T/run2" >"$T/out" 2>"$T/err" &
pid=$!
i=0
while [ $i -lt 100 ] && ! grep -q "^step 2" "$T/err"; do sleep 0.1; i=$((i + 1)); done
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && ok "SIGINT exits 130" || bad "SIGINT exit code $rc"
summary "s['status'] == 'interrupted' and s['steps'] >= 2" "summary status interrupted"

# Early stopping and best/ act on eval metrics: a config where they never could is an error.
FM=/usr/share/datasets/fashion-mnist
cat >"$T/noeval.json" <<JSON
{"train": {"format": "idx", "images": "$FM/train-images-idx3-ubyte.gz", "labels": "$FM/train-labels-idx1-ubyte.gz"}}
JSON
run 2 "early stopping on eval_loss without data.eval" --config configs/fmnist_mlp.json --data "$T/noeval.json" \
    --set 'train.early_stopping={"metric": "eval_loss"}' --set train.max_steps=1
has "$T/err" "data.eval is not set" "early stopping without eval set says why"
run 2 "best_metric eval_accuracy without accuracy" --config configs/fmnist_mlp.json \
    --set 'model.loss={"type": "mse"}' --set train.best_metric=eval_accuracy --set train.max_steps=1
has "$T/err" "not a classification loss" "eval_accuracy on a regression loss says why"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
