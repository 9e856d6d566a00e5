#!/bin/sh
# The capped device (CTRAIN_CAPPED_DEVICE, core/cpu/cpu_capped.c): the CPU behaving as a separate
# device of a fixed size, whose copies run on a thread of their own at a throttled bandwidth. A run
# on it takes every device path (uploads of the loader's batches, checkpoint staging, activation
# offload's downloads and uploads) and must give the plain CPU's weights bit for bit:
#   - fp32, 20 steps, copies at 2 GB/s; the device peak in the summary under the cap, the plan
#     within 5% of it per category;
#   - bf16 with activation checkpointing and cpu_checkpointing (kept outputs down and up again);
#   - fp16 from loss scale 2^24 (overflow skips), with data.transform.on_device (uint8 uploads);
#   - a resume: 10 steps, then 10 more from the checkpoint, equals 20 at once;
#   - a cap below the plan stops the run at start (exit 1) with the plan's figures and the
#     variable named; a value CTRAIN_CAPPED_DEVICE cannot read is exit 2.
# Usage: e2e_capped.sh BUILD_DIR. Exit 77 (skipped) when the Fashion-MNIST package is missing.
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
need_fmnist
scratch_dir
CAP=48MiB

# run NAME DEVICE [ARGS]: 20 steps (unless ARGS says otherwise) of the MLP; DEVICE "cpu", or a
# CTRAIN_CAPPED_DEVICE value.
run() {
    name=$1 dev=$2
    shift 2
    if [ "$dev" = cpu ]; then set -- env -u CTRAIN_CAPPED_DEVICE "$B" "$@"
    else set -- env CTRAIN_CAPPED_DEVICE="$dev" "$B" "$@"; fi
    "$@" --config configs/fmnist_mlp.json --set train.max_steps=20 --set data.eval.limit=200 \
        --set data.workers=2 --set train.run_dir="$T/$name" --summary "$T/$name.json" >"$T/$name.log" 2>&1
}
weights() { echo "$T/$1/checkpoints/global_step${2:-20}/model.safetensors"; }
same() {   # WHAT A B: the two runs' models are the same bytes
    if cmp -s "$(weights "$2")" "$(weights "$3")"; then ok "$1: the capped device's weights are the CPU's, bit for bit"
    else bad "$1: weights differ ($(tail -2 "$T/$3.log" | head -1))"; fi
}

# fp32, throttled copies: same bits; the summary's device peak is the capped device's, under the cap
run cpu32 cpu && run cap32 "$CAP,gbps=2" || bad "fp32 runs failed: $(tail -3 "$T/cap32.log")"
same fp32 cpu32 cap32
has "$T/cap32.log" "capped device of 48.0 MiB, copies at 2 GB/s" "the start block names the capped device"
if python3 - "$T/cap32.json" "$T/cpu32.json" <<'PY'
import json, sys
s, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
peak, plan = s["peak_bytes_by_category"], s["planned_bytes_by_category"]
cap = 48 << 20
assert 0 < s["peak_device_bytes"] <= cap, f"device peak {s['peak_device_bytes']} vs cap {cap}"
assert c["peak_device_bytes"] == 0, "the CPU has no device peak"
assert peak["loader"] > 0, "the loader's batches are on the device"
bad = [f"{k}: planned {plan[k]}, peak {peak[k]}" for k in plan if abs(plan[k] - peak[k]) > 0.05 * max(peak[k], 1)]
assert not bad, "; ".join(bad)
PY
then ok "fp32: device peak under the cap, plan within 5% of the peaks"
else bad "fp32: device peak or plan"; fi

# bf16, activation checkpointing with the kept outputs offloaded to host memory and back
CK="--set bf16.enabled=true --set activation_checkpointing.number_checkpoints=6 --set activation_checkpointing.cpu_checkpointing=true"
run cpu16 cpu $CK && run cap16 "$CAP,gbps=1" $CK || bad "bf16 runs failed: $(tail -3 "$T/cap16.log")"
same "bf16 with cpu_checkpointing" cpu16 cap16
has "$T/cap16.log" "offloaded .* kept output" "bf16: the kept outputs are offloaded on the capped device"

# fp16 from 2^24 (overflows skip steps), the loader's uint8 batches normalised on the device
FP="--set fp16.enabled=true --set fp16.initial_scale_power=24 --set data.transform.on_device=true"
run cpufp cpu $FP && run capfp "$CAP" $FP || bad "fp16 runs failed: $(tail -3 "$T/capfp.log")"
same "fp16 with overflow skips, on_device" cpufp capfp
skipped=$(sed 's/.*"skipped_steps":\([0-9]*\).*/\1/' "$T/capfp.json")
[ "$skipped" -gt 0 ] && ok "fp16: $skipped overflowing steps skipped" || bad "fp16: no step skipped"

# resume: 10 steps, then 10 more from the checkpoint (staged through host memory)
run half "$CAP,gbps=4" --set train.max_steps=10 &&
    run half "$CAP,gbps=4" --resume auto || bad "resume failed: $(tail -3 "$T/half.log")"
if cmp -s "$(weights half)" "$(weights cap32)"; then ok "resume on the capped device: 10 + 10 steps equal 20"
else bad "resume: weights differ from the uninterrupted run"; fi

# a cap below the plan: stopped at start, the plan and the variable named
run small 4MiB
rc=$?
eq "a cap below the plan: exit code" "$rc" 1
has "$T/small.log" "the memory plan needs .* but the capped device's memory (4.0 MiB, CTRAIN_CAPPED_DEVICE)" \
    "the refusal names the plan and the capped device"
has "$T/small.log" "planned: params" "the refusal gives the plan's figures"

# a value it cannot read
run badenv "48MiB,gbps=fast"
rc=$?
eq "an unreadable CTRAIN_CAPPED_DEVICE: exit code" "$rc" 2
has "$T/badenv.log" 'CTRAIN_CAPPED_DEVICE="48MiB,gbps=fast"' "the error names the variable and its value"

[ $fails -eq 0 ] && echo "all capped device checks passed" || { echo "$fails failed"; exit 1; }
