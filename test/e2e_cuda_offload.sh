#!/bin/sh
# ZeRO-Offload on the CUDA backend (run by `make test-cuda` / gpu_check's tests phase): e2e_offload.sh's
# and e2e_capped.sh's comparisons with train.device cuda, where the pinned host memory is cudaHostAlloc's
# and every upload and download is a real asynchronous copy on the copy stream (the capped device
# cannot tell a kernel that reads host memory from one that reads an upload, a GPU can). The model is
# e2e_offload.sh's GPT (431 k parameters, 2 blocks of width 128, tied head, micro-batch 1 x accumulation
# 4, clipping 0.5, AdamW, 20 steps); "the cap" is train.memory_limit_gb, which a GPU run's plan must
# fit at start as on the capped device.
#   - stage 2 + offload_optimizer in fp32, bf16 and fp16 (from loss scale 2^30: overflow skips, as many
#     as without offload), and stage 3 + both offloads, against the GPU run without offload: every
#     tensor within 1e-5 relative in fp32 and 5e-3 in 16-bit. Not the same bits: without offload the
#     GPU's AdamW (FMA-contracted) steps the master and the GEMMs add each micro-batch's gradient into
#     the running sum; with it the CPU's Adam (no FMA) steps it and each layer's gradient is summed in
#     a zeroed scratch and added on the host. One ulp of difference in the master flips the 16-bit
#     rounding of a few compute-copy elements (2^-8 relative each), which the next steps carry; a run
#     that lost one layer's gradient of one micro-batch for one step differs by about 1e-2;
#   - the device peak under the cap and each device category the plan's (on the GPU as its caching
#     allocator holds it: size classes up to 1/8 over, and cuBLASLt's 4 MiB workspace, which no plan
#     holds; check_summary), the host categories (master, gradients, optimizer state) exactly the
#     plan, none of that state on the device;
#   - the same bits on the same GPU, where the arithmetic is the same and only the copies' timing
#     differs: chunks of 20 k elements (staging buffers reused as each upload lands) against one chunk;
#     overlap_comm off against on (each layer's download waited for at once or two layers later);
#     stage 3's prefetch off against 100 k elements ahead; pin_memory false (pageable: cudaMemcpy from
#     ordinary memory) against true; a resume (10 + 10 steps) against 20 at once;
#   - cpu_checkpointing (4 segments: 2 kept outputs down to pinned host memory and up again; with 2
#     segments nothing runs while one would be away, and nothing is offloaded) against the same
#     checkpointing without it: the same bits;
#   - without offload, a cap below the plan stops the run at start (exit 1) naming offload_optimizer;
#   - --dry-run's table of ZeRO stages and offload plans for the device's own memory (on a GPU its
#     total, read by opening the CUDA backend and nothing allocated; the stand-in's cap) and, with
#     --device-memory, for the device it names, its rows the plans the runs above were held to.
# CT_CUDA_STANDIN=capped runs the same script on the CPU's capped device (CTRAIN_CAPPED_DEVICE=1GiB),
# to try its logic without a GPU (test/e2e_gpu_check.sh does). Usage: e2e_cuda_offload.sh BUILD_DIR.
# Exit 77 (skipped) without a GPU or /usr/share/common-licenses.
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
. test/lib_models.sh
cuda_or_standin
scratch_dir
licence_tokens "$B" "$T/tok"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

offload_gpt_config "$DEV" >"$T/gpt.json"
NOOFF="--set zero_optimization.offload_optimizer.device=none"
Z3="--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=cpu
    --set zero_optimization.stage3_param_persistence_threshold=1000 --set zero_optimization.stage3_prefetch_bucket_size=100000"

# run NAME [ARGS]: a run into $T/NAME, its summary in $T/NAME.json
run() {
    name=$1
    shift
    "$B" --config "$T/gpt.json" --set train.run_dir="$T/$name" --summary "$T/$name.json" "$@" >"$T/$name.log" 2>&1
}
# cap BYTES: the overrides that cap a run at BYTES (train.memory_limit_gb)
cap() { echo "--set train.memory_limit_gb=$("$PY" -c "print(repr($1 / 2**30))")"; }
# expect_same_bits WHAT A B [STEP]: ok when A's and B's models are the same bits (lib_models' same_bits),
# else bad with how far apart they are
expect_same_bits() {
    if same_bits "$2" "$3" "${4:-20}"; then ok "$1: the same bits"
    else bad "$1: the bits differ ($(close "$2" "$3" 1))"; fi
}
# check_summary NAME CAP: the device peak under CAP, the device plan = the peaks per category, the
# host state exactly the plan, none of it on the device. On the capped device (the stand-in) the
# peaks are the plan's bytes (within 5%: the check e2e_offload makes). The CUDA backend counts what
# its caching allocator holds (cuda_mem.cu): each block rounded up to its size class (512 B at
# least, at most 1/8 more), and cuBLASLt's fixed workspace (4 MiB, allocated once, which no plan
# holds) under workspace: there each category's peak is between the plan and 1/8 + 64 KiB over it,
# workspace at least the plan, and the device peak less workspace's excess over the plan under
# CAP with the same rounding.
check_summary() {
    "$PY" - "$T/$1.json" "$2" "$DEV" <<'EOF' 2>&1
import json, sys
s = json.load(open(sys.argv[1]))
cap, gpu = int(sys.argv[2]), sys.argv[3] == "cuda"
dev, plan = s["peak_bytes_by_category"], s["planned_bytes_by_category"]
host, hplan = s["peak_host_bytes_by_category"], s["planned_host_bytes_by_category"]
def rounded(b):   # a plan's bytes as the CUDA allocator may hold them at most
    return b * 9 // 8 + (64 << 10) if b else 0
if gpu:
    extra = dev["workspace"] - plan["workspace"]
    assert extra >= 0, f"workspace: planned {plan['workspace']}, peak {dev['workspace']}"
    peak = s["peak_device_bytes"] - extra
    assert 0 < peak <= rounded(cap), f"device peak {s['peak_device_bytes']} less the workspace's {extra}, cap {cap}"
    off = [f"{k}: planned {plan[k]}, peak {dev[k]}" for k in plan if k != "workspace" and not plan[k] <= dev[k] <= rounded(plan[k])]
else:
    assert 0 < s["peak_device_bytes"] <= cap, f"device peak {s['peak_device_bytes']}, cap {cap}"
    off = [f"{k}: planned {plan[k]}, peak {dev[k]}" for k in plan if abs(plan[k] - dev[k]) > 0.05 * max(dev[k], plan[k], 1)]
assert not off, "device: " + "; ".join(off)
assert all(host[k] == hplan[k] for k in ("master", "grads", "optim")), f"host: peak {host}, plan {hplan}"
assert dev["optim"] == dev["grads"] == 0 and dev["master"] <= (512 if gpu else 64), f"state on the device: {dev}"
assert hplan["optim"] > 0, "nothing offloaded"
EOF
}

# ---- stage 2 + optimizer offload, and stage 3 + both, against the run without offload ----
for prec in fp32 bf16 fp16; do
    case $prec in
    fp32) P="" capb=$((3 << 20)) tol=1e-5 ;;
    bf16) P="--set bf16.enabled=true" capb=$((1600 << 10)) tol=5e-3 ;;
    fp16) P="--set fp16.enabled=true --set fp16.initial_scale_power=30" capb=$((1600 << 10)) tol=5e-3 ;;
    esac
    # shellcheck disable=SC2086 # P, NOOFF, Z3 and cap's output are lists of words
    run "ref_$prec" $P $NOOFF || { bad "$prec without offload: exit $?: $(tail -2 "$T/ref_$prec.log")"; continue; }
    # shellcheck disable=SC2086
    if run "off_$prec" $P $(cap $capb); then
        d=$(close "ref_$prec" "off_$prec" $tol) && ok "$prec, stage 2 + offload_optimizer: within $tol of the run without offload ($d)" ||
            bad "$prec, stage 2 + offload: $d"
        why=$(check_summary "off_$prec" $capb) && ok "$prec, stage 2 + offload: device peak under the cap, plan = peaks, state in host memory" ||
            bad "$prec, stage 2 + offload: $why"
    else bad "$prec, stage 2 + offload: exit $?: $(tail -2 "$T/off_$prec.log")"; fi
    # shellcheck disable=SC2086
    if run "z3_$prec" $P $Z3 $(cap $((capb * 3 / 4))); then
        d=$(close "ref_$prec" "z3_$prec" $tol) && ok "$prec, stage 3 + both offloads: within $tol of the run without offload ($d)" ||
            bad "$prec, stage 3 + both offloads: $d"
        why=$(check_summary "z3_$prec" $((capb * 3 / 4))) && ok "$prec, stage 3 + both offloads: device peak under the cap, plan = peaks, state in host memory" ||
            bad "$prec, stage 3 + both offloads: $why"
    else bad "$prec, stage 3 + both offloads: exit $?: $(tail -2 "$T/z3_$prec.log")"; fi
done
s=$(sed -n 's/.*"skipped_steps":\([0-9]*\).*/\1/p' "$T/off_fp16.json" 2>/dev/null)
r=$(sed -n 's/.*"skipped_steps":\([0-9]*\).*/\1/p' "$T/ref_fp16.json" 2>/dev/null)
[ -n "$s" ] && [ "$s" -gt 0 ] && [ "$s" = "$r" ] && ok "fp16: $s overflowing steps skipped, as without offload" ||
    bad "fp16: skipped ${s:-?} with offload, ${r:-?} without"
has "$T/off_bf16.log" "ZeRO stage 2 with optimizer offload" "the start block says the optimizer is offloaded"

# ---- the copies' timing changes no bit ----
B16="--set bf16.enabled=true"
# shellcheck disable=SC2086
run chunks $B16 --set zero_optimization.sub_group_size=20000 && run one_chunk $B16 --set zero_optimization.sub_group_size=100000000 &&
    expect_same_bits "chunks of 20 k elements against one chunk" chunks one_chunk || bad "chunk runs failed: $(tail -2 "$T/chunks.log")"
# shellcheck disable=SC2086
run overlap_off $B16 --set zero_optimization.overlap_comm=false && run overlap_on $B16 --set zero_optimization.overlap_comm=true &&
    expect_same_bits "overlap_comm off against on" overlap_off overlap_on || bad "overlap runs failed: $(tail -2 "$T/overlap_on.log")"
# shellcheck disable=SC2086
run prefetch0 $B16 $Z3 --set zero_optimization.stage3_prefetch_bucket_size=0 && expect_same_bits "stage 3: prefetch off against 100 k elements ahead" prefetch0 z3_bf16 ||
    bad "stage 3 prefetch runs failed: $(tail -2 "$T/prefetch0.log")"
# shellcheck disable=SC2086
run pageable $B16 --set zero_optimization.offload_optimizer.pin_memory=false && expect_same_bits "pin_memory false (pageable host state) against pinned" pageable off_bf16 ||
    bad "pageable run failed: $(tail -2 "$T/pageable.log")"
has "$T/pageable.log" "in pageable host memory" "pin_memory false: the start block says pageable"
# shellcheck disable=SC2086
{ run half $B16 --set train.max_steps=10 && run half $B16 --resume auto; } && expect_same_bits "a resume with offload (10 + 10 steps against 20)" half off_bf16 ||
    bad "resume failed: $(tail -2 "$T/half.log")"
CK="--set bf16.enabled=true --set activation_checkpointing.number_checkpoints=4"
# shellcheck disable=SC2086
run ckpt $CK $NOOFF && run ckpt_cpu $CK $NOOFF --set activation_checkpointing.cpu_checkpointing=true &&
    expect_same_bits "cpu_checkpointing against the same checkpointing on the device" ckpt ckpt_cpu || bad "checkpointing runs failed: $(tail -2 "$T/ckpt_cpu.log")"
has "$T/ckpt_cpu.log" "offloaded .* kept output" "cpu_checkpointing: the kept outputs are offloaded"

# ---- without offload: stopped at start with the plan and what fits ----
# shellcheck disable=SC2086
run nooff $B16 $NOOFF $(cap $((1600 << 10)))
eq "without offload under a 1.6 MiB cap: exit code" "$?" 1
has "$T/nooff.log" "the memory plan needs .* but .* allows 1.6 MiB" "the refusal names the plan and the cap"
has "$T/nooff.log" '"offload_optimizer": {"device": "cpu"}} plans .* of device memory' "the refusal names offload_optimizer, which fits"

# ---- the dry run's ZeRO table for this device ----
"$B" --config "$T/gpt.json" --set bf16.enabled=true --dry-run --host-memory 1GiB >/dev/null 2>"$T/dry.err"
eq "dry run: exit code" "$?" 0
if [ "$DEV" = cuda ]; then src="cuda: .*"; else src="the capped device, CTRAIN_CAPPED_DEVICE"; fi
has "$T/dry.err" "ZeRO stage and offload, per rank, .* on a device of .* ($src) beside 1.0 GiB of host memory (--host-memory)" \
    "the ZeRO table plans for the device's own memory"
has "$T/dry.err" "^ *0  none .*yes .*<- cheapest that fits" "on the whole device stage 0 without offload fits"
"$B" --config "$T/gpt.json" --set bf16.enabled=true --dry-run --device-memory 1600KiB --host-memory 1GiB >/dev/null 2>"$T/dry16.err"
has "$T/dry16.err" "^ *2  optimizer  *stage 2 .*yes .*<- this config" "on 1.6 MiB the config's row (stage 2 + optimizer offload) fits"
has "$T/dry16.err" "^ *0  none .* no " "on 1.6 MiB stage 0 without offload does not"
dev=$(sed -n 's/^ *2  optimizer  *stage 2  *\([0-9.]* [KMG]*i*B\) .*/\1/p' "$T/dry16.err")
planned=$("$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print(sum(s['planned_bytes_by_category'].values()))" "$T/off_bf16.json" 2>/dev/null)
want=$("$PY" -c "import sys; b = float(sys.argv[1]); u = 0
while b >= 1024 and u < 4: b /= 1024; u += 1
print(('%.1f %s' if u else '%.0f %s') % (b, ['B', 'KiB', 'MiB', 'GiB', 'TiB'][u]))" "${planned:-0}")
eq "the config's row: the device plan of the bf16 run with offload" "$dev" "$want"

[ $fails -eq 0 ] && echo "all offload checks passed on $DEV$STANDIN" || { echo "$fails failed"; exit 1; }
