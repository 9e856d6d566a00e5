#!/bin/sh
# End-to-end mixed precision on the CPU: fmnist_mlp for 300 steps in fp32, fp16 and bf16 (same
# seed, same batches) must reach eval accuracies within 2 points of fp32's; the summary and the
# step lines carry the loss scale; a forced overflow at the minimum scale exits 4; fp16 and bf16
# together is a config error.
# Usage: e2e_amp.sh BUILD_DIR. Fails, naming it, when the Fashion-MNIST package is missing (make deps
# installs it).
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
need_fmnist
scratch_dir
# run CODE NAME DESCRIPTION ARGS...: ctrain --summary $T/NAME.json ARGS; check the exit code
run() {
    code=$1; name=$2; what=$3; shift 3
    "$B" --summary "$T/$name.json" --set train.run_dir="$T/run_$name" "$@" >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$what"; else bad "$what (exit $rc, expected $code)"; sed 's/^/     /' "$T/$name.err" | tail -5; fi
}
# check EXPR DESCRIPTION: a Python expression over the summaries (dict s by run name) must hold
check() {
    if python3 -c "
import json, glob, os, sys
s = {os.path.basename(p)[:-5]: json.load(open(p)) for p in glob.glob('$T/*.json')}
sys.exit(0 if ($1) else 1)" 2>"$T/py.err"; then
        ok "$2"
    else
        bad "$2"; cat "$T"/*.json 2>/dev/null | sed 's/^/     /'; sed 's/^/     /' "$T/py.err"
    fi
}

MLP="--config configs/fmnist_mlp.json --set train.max_steps=300 --set data.eval.limit=2000 --set steps_per_print=100"
run 0 fp32 "fmnist_mlp fp32, 300 steps" $MLP
run 0 fp16 "fmnist_mlp fp16, 300 steps" $MLP --set fp16.enabled=true
run 0 bf16 "fmnist_mlp bf16, 300 steps" $MLP --set bf16.enabled=true
check "all(s[k]['status'] == 'ok' and s[k]['steps'] == 300 for k in ('fp32', 'fp16', 'bf16'))" "all three finish"
check "s['fp32']['eval_accuracy'] > 0.80" "fp32 accuracy > 80%"
check "abs(s['fp16']['eval_accuracy'] - s['fp32']['eval_accuracy']) < 0.02" "fp16 accuracy within 2 points of fp32"
check "abs(s['bf16']['eval_accuracy'] - s['fp32']['eval_accuracy']) < 0.02" "bf16 accuracy within 2 points of fp32"
check "s['fp16']['loss_scale'] == 65536 and s['fp16']['skipped_steps'] == 0" "fp16 summary: loss_scale 65536, no skips"
check "s['bf16']['loss_scale'] is None and s['fp32']['loss_scale'] is None" "bf16/fp32 summary: loss_scale null"
check "s['fp16']['eval_accuracy'] != s['fp32']['eval_accuracy'] or s['fp16']['train_loss'] != s['fp32']['train_loss']" "fp16 really rounds (differs from fp32)"
has "$T/fp16.err" "step 100/300 .* scale 65536" "fp16 step line shows the scale"
has "$T/fp16.err" "· fp16 ·" "start line names fp16"
has "$T/bf16.err" "· bf16 ·" "start line names bf16"

# An overflow at the minimum scale: 2^126 with minimum 2^126 overflows at once -> exit 4.
run 4 min "overflow at the minimum scale exits 4" $MLP --set fp16.enabled=true \
    --set fp16.initial_scale_power=126 --set fp16.min_loss_scale=8.507059e37 --set fp16.hysteresis=1
has "$T/min.err" "loss scale at its minimum" "message says the scale is at its minimum"
has "$T/min.err" '"bf16": {"enabled": true}' "message suggests bf16"
check "s['min']['status'] == 'diverged' and s['min']['skipped_steps'] == 1" "summary: diverged, 1 skipped"

run 2 both "fp16 and bf16 together is a config error" $MLP --set fp16.enabled=true --set bf16.enabled=true
has "$T/both.err" "enable one of them" "the error says to pick one"

[ "$fails" -eq 0 ] && echo "e2e_amp: all passed" || echo "e2e_amp: $fails failed"
[ "$fails" -eq 0 ]
