#!/bin/sh
# NVMe offload of the optimizer (zero_optimization.offload_optimizer.device "nvme": ZeRO-Infinity;
# docs/distributed.md, "NVMe offload"): the fp32 master and Adam's moments in swap files under
# nvme_path, host memory holding the swap's buffers only. The model is e2e_offload.sh's GPT (431 k
# parameters, a tied head, micro-batch 1 with accumulation 4, clipping, AdamW), on the capped device
# (CTRAIN_CAPPED_DEVICE) with train.host_memory_limit_gb 4 MiB: its master and Adam state (4.9 MiB)
# are larger than that budget, so ZeRO-Offload to host memory stops at start and NVMe offload trains.
#   - fp32, bf16, fp16 (from loss scale 2^30: overflow skips), stage 2, one process: the weights
#     and the Adam state after 20 steps are those of offload to host memory, bit for bit (the same
#     CPU Adam over the same chunks; the step only reads its chunks from files); the device peak under
#     the cap, the host peaks equal to the plan and under the budget, the swap files removed;
#   - without a tied head or accumulation (additions as without offload) the same bits as the run
#     without any offload on the plain CPU;
#   - on the plain CPU backend with train.memory_limit_gb: NVMe offload trains (the same bits as on
#     the capped device), without it the run stops naming NVMe offload;
#   - kill -9 in the middle of a step (NVME_KILLS times, at random moments; 1 by default), then
#     --resume auto: the bytes of the uninterrupted run, the killed run's swap directory removed
#     with a warning;
#   - the swap on tmpfs (/dev/shm) too: the same bits; the log says whether each used direct I/O;
#   - mpirun -np 2 (when installed): stages 2 and 3 with NVMe offload give the bits of 2 ranks without
#     offload (fp16, overflow skips), and their per-rank shards at step 10 resume on one process
#     with the bits of the same resume under offload to host memory;
#   - errors: nvme_path missing, a file, read-only (exit 2 naming it), a file-size limit below the
#     swap's files (exit 1 naming the file), Lamb and offload_param "nvme" refused by name (exit 2);
#     --dry-run shows the swap and checks nvme_path.
# Usage: e2e_nvme.sh BUILD_DIR. NVME_KILLS=N kills N runs (locally: 5 or more).
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
. test/lib_models.sh
scratch_dir
licence_tokens "$B" "$T/tok"
PY=/usr/bin/python3
NV="$T/nvme"   # on the scratch directory's file system (a real disk here; tmpfs elsewhere)
mkdir -p "$NV"

cat >"$T/gpt.json" <<JSON
{
  "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
  "gradient_clipping": 0.5,
  "zero_optimization": {"stage": 2, "sub_group_size": 20000,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "$NV", "pin_memory": true}},
  "model": $(offload_gpt_model),
  "data": {"train": {"format": "tokens", "path": "$T/tok/train.bin", "seq_len": 32}, "shuffle": true},
  "train": {"max_steps": 20, "save_interval": 10, "seed": 7, "device": "cpu", "threads": 2,
            "host_memory_limit_gb": 0.00390625}
}
JSON
BUDGET=$((4 << 20))
CPUOFF="--set zero_optimization.offload_optimizer.device=cpu --set train.host_memory_limit_gb=0"

# run NAME DEVICE [ARGS]: DEVICE "cpu", or a CTRAIN_CAPPED_DEVICE value
run() {
    name=$1 dev=$2
    shift 2
    if [ "$dev" = cpu ]; then set -- env -u CTRAIN_CAPPED_DEVICE "$B" "$@"
    else set -- env CTRAIN_CAPPED_DEVICE="$dev" "$B" "$@"; fi
    "$@" --config "$T/gpt.json" --set train.run_dir="$T/$name" --summary "$T/$name.json" >"$T/$name.log" 2>&1
}
# same_state A B [STEP]: the same weights (same_bits) and the same optimizer state, byte for byte
same_state() {
    same_bits "$1" "$2" "${3:-20}" && cmp -s "$T/$1/checkpoints/global_step${3:-20}/optimizer.safetensors" \
        "$T/$2/checkpoints/global_step${3:-20}/optimizer.safetensors"
}
# swap_empty DIR: no swap directory left under DIR
swap_empty() { [ -z "$(ls -A "$1")" ]; }
# io_of NAME: how the run's swap moved its bytes (its start block's NVMe line)
io_of() { grep -o "direct I/O\|buffered I/O" "$T/$1.log" | head -1; }
# check_summary NAME CAP: the device peak under CAP, the host peaks the plan's and under the budget,
# the state in the swap (no master in host memory, the swap's buffers as the optimizer's bytes)
check_summary() {
    "$PY" -c "
import json
s = json.load(open('$T/$1.json'))
host, hplan = s['peak_host_bytes_by_category'], s['planned_host_bytes_by_category']
assert 0 < s['peak_device_bytes'] <= $2, f'device peak {s[\"peak_device_bytes\"]}, cap $2'
assert all(host[k] == hplan[k] for k in hplan if k != 'loader'), f'host: peak {host}, plan {hplan}'
assert host['master'] == 0, f'a master in host memory: {host}'
total = sum(v for k, v in host.items() if k != 'loader')
assert total <= $BUDGET, f'host peak {total} over the budget $BUDGET'
" 2>&1
}

# ---- one process: fp32, bf16, fp16 against offload to host memory ----
for prec in fp32 bf16 fp16; do
    case $prec in
    fp32) P="" cap=$((3 << 20)) ;;   # fp32 keeps a 4-byte copy on the device
    bf16) P="--set bf16.enabled=true" cap=$((1600 << 10)) ;;
    fp16) P="--set fp16.enabled=true --set fp16.initial_scale_power=30" cap=$((1600 << 10)) ;;
    esac
    run "cpu_$prec" "${cap}B" $P $CPUOFF && run "nv_$prec" "${cap}B,gbps=1" $P ||
        { bad "$prec runs failed: $(tail -3 "$T/nv_$prec.log")"; continue; }
    same_state "cpu_$prec" "nv_$prec" && ok "$prec, stage 2 + NVMe offload: the weights and Adam state of offload to host memory, bit for bit" ||
        bad "$prec: NVMe offload differs from offload to host memory ($(close "cpu_$prec" "nv_$prec" 1))"
    why=$(check_summary "nv_$prec" $cap) && ok "$prec: device peak under the cap, host peaks = plan, under the 4 MiB budget" ||
        bad "$prec: $why"
    swap_empty "$NV" && ok "$prec: the swap files are removed at the end" || bad "$prec: left in $NV: $(ls "$NV")"
done
echo "     (swap on $(df -T "$NV" | awk 'NR == 2 {print $2}') at $NV: $(io_of nv_fp32))"
has "$T/nv_bf16.log" "ZeRO stage 2 with optimizer offload to NVMe (fp32 master and optimizer state in NVMe swap files under $NV" \
    "the start block says where the state is"
has "$T/nv_bf16.log" "host memory beside it (optimizer offload to NVMe): grads 1.6 MiB, NVMe swap buffers 916.0 KiB" \
    "the plan's host line has the swap's buffers, no master"
has "$T/nv_bf16.log" "NVMe swap: 4.9 MiB of files under $NV (master, exp_avg, exp_avg_sq: 431.4 k elements), 4 host buffers" \
    "the start block has the swap's files"
s=$(sed 's/.*"skipped_steps":\([0-9]*\).*/\1/' "$T/nv_fp16.json")
r=$(sed 's/.*"skipped_steps":\([0-9]*\).*/\1/' "$T/cpu_fp16.json")
[ "$s" -gt 0 ] && [ "$s" = "$r" ] && ok "fp16: $s overflowing steps skipped, as with offload to host memory" ||
    bad "fp16: skipped $s with NVMe, $r without"

# ---- the budget: offload to host memory does not fit it, and says what would ----
run over "$((1600 << 10))B" --set bf16.enabled=true --set zero_optimization.offload_optimizer.device=cpu
eq "offload to host memory over the 4 MiB host budget: exit code" "$?" 1
has "$T/over.log" "the host memory plan needs 6.9 MiB but train.host_memory_limit_gb 0.00390625 allows 4.0 MiB" \
    "the refusal names the budget and the plan"
has "$T/over.log" "NVMe offload fits: .*\"device\": \"nvme\"" "the refusal names NVMe offload, which fits"

# ---- where the additions are those without offload: the bits of the run without any ----
NOACC="--set train_batch_size=4 --set train_micro_batch_size_per_gpu=4 --set gradient_accumulation_steps=1"
sed 's/, "tie": "wte.weight"//' "$T/gpt.json" >"$T/untied.json" && cp "$T/gpt.json" "$T/tied.json" &&
    cp "$T/untied.json" "$T/gpt.json"
run plain cpu $NOACC --set zero_optimization.offload_optimizer.device=none --set train.host_memory_limit_gb=0 &&
    run nv_plain 8MiB $NOACC || bad "untied runs failed: $(tail -3 "$T/nv_plain.log")"
same_state plain nv_plain && ok "untied, no accumulation: NVMe offload gives the bits of the run without offload" ||
    bad "untied: bits differ"
cp "$T/tied.json" "$T/gpt.json"

# ---- the plain CPU backend: its memory is host memory, memory_limit_gb the budget ----
CPU="--set train.host_memory_limit_gb=0 --set train.memory_limit_gb=0.006"
run cpu_nv cpu $CPU || bad "NVMe offload on the CPU backend failed: $(tail -3 "$T/cpu_nv.log")"
same_state nv_fp32 cpu_nv && ok "CPU backend: NVMe offload within train.memory_limit_gb, the bits of the capped device's" ||
    bad "CPU backend: bits differ from the capped device's"
run cpu_over cpu $CPU --set zero_optimization.offload_optimizer.device=none
eq "CPU backend without NVMe offload over train.memory_limit_gb: exit code" "$?" 1
has "$T/cpu_over.log" "train.memory_limit_gb 0.006 allows 6.1 MiB" "the refusal names memory_limit_gb"
has "$T/cpu_over.log" "NVMe offload fits" "the refusal names NVMe offload"

# ---- kill -9 in the middle of a step, then --resume auto: the uninterrupted run's bytes ----
i=0
while [ $i -lt "${NVME_KILLS:-1}" ]; do
    i=$((i + 1))
    rm -rf "$T/k"
    # copies at 0.05 GB/s: a step takes ~50 ms, so a kill a few ms after step 12's line lands in step 13
    CTRAIN_CAPPED_DEVICE="3MiB,gbps=0.05" "$B" --config "$T/gpt.json" --set train.run_dir="$T/k" >"$T/k.log" 2>&1 &
    pid=$!
    n=0
    while ! grep -q "^step 12/20" "$T/k.log" 2>/dev/null && [ $n -lt 600 ]; do sleep 0.05; n=$((n + 1)); done
    sleep "0.0$(awk -v s=$i 'BEGIN {srand(s); printf "%d", rand() * 9}')"
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    st=$?
    [ $st = 137 ] || { bad "kill $i: the run ended with $st before the kill: $(tail -2 "$T/k.log")"; continue; }
    left=$(ls "$NV" | wc -l)
    CTRAIN_CAPPED_DEVICE="3MiB,gbps=0.05" "$B" --config "$T/gpt.json" --set train.run_dir="$T/k" --resume auto \
        >"$T/k2.log" 2>&1 || { bad "kill $i: the resume failed: $(tail -3 "$T/k2.log")"; continue; }
    same_state nv_fp32 k && ok "kill -9 $i during step 13, --resume auto from step 10: the bytes of the uninterrupted run" ||
        bad "kill $i: the resumed run differs"
    [ "$left" = 1 ] && grep -q "NVMe swap: removed $NV/ctrain-swap-optimizer-rank0-" "$T/k2.log" && swap_empty "$NV" &&
        ok "kill $i: the killed run's swap directory removed by the next run, with a warning" ||
        bad "kill $i: $left swap directories after the kill; now $(ls "$NV")"
done

# ---- the swap on tmpfs ----
if [ -d /dev/shm ] && SHM=$(mktemp -d /dev/shm/ctrain-nvme-XXXXXX 2>/dev/null); then
    run shm 3MiB --set zero_optimization.offload_optimizer.nvme_path="$SHM" || bad "tmpfs run failed: $(tail -3 "$T/shm.log")"
    same_state nv_fp32 shm && ok "swap on tmpfs ($SHM: $(io_of shm)): the same bits" || bad "tmpfs: bits differ"
    swap_empty "$SHM" && rmdir "$SHM"
fi

# ---- 2 ranks: stages 2 and 3 against 2 ranks without offload; their shards on one process ----
if command -v mpirun >/dev/null 2>&1 && [ -f "${1:-build}/libctrain_mpi.so" ]; then
    MPI="mpirun --allow-run-as-root --oversubscribe -np 2"
    # the budget is the one-process runs' (a rank's landing buffers take more)
    A="--set train_batch_size=8 --set fp16.enabled=true --set fp16.initial_scale_power=30 --set train.host_memory_limit_gb=0 --quiet"
    for st in 2 3; do
        $MPI env -u CTRAIN_CAPPED_DEVICE "$B" --config "$T/gpt.json" $A --set zero_optimization.stage=$st \
            --set zero_optimization.offload_optimizer.device=none --set train.run_dir="$T/np_ref$st" >"$T/np_ref$st.log" 2>&1 &&
            $MPI -x CTRAIN_CAPPED_DEVICE=6MiB,gbps=2 "$B" --config "$T/gpt.json" $A --set zero_optimization.stage=$st \
                --set train.run_dir="$T/np_nv$st" >"$T/np_nv$st.log" 2>&1 ||
            { bad "2 ranks, stage $st failed: $(grep error "$T"/np_*$st.log | head -2)"; continue; }
        same_bits "np_ref$st" "np_nv$st" && ok "2 ranks, stage $st + NVMe offload: the bits of 2 ranks without offload" ||
            bad "2 ranks, stage $st: bits differ ($(close "np_ref$st" "np_nv$st" 1))"
    done
    swap_empty "$NV" && ok "2 ranks: both ranks' swap files removed" || bad "2 ranks: left in $NV: $(ls "$NV")"
    # each run's per-rank shards at step 10 on one process: NVMe offload against offload to host memory
    R="--set fp16.enabled=true --set fp16.initial_scale_power=30 --set train.host_memory_limit_gb=0"
    run re_nv 3MiB $R --resume "$T/np_nv2/checkpoints/global_step10" &&
        run re_cpu 3MiB $R $CPUOFF --resume "$T/np_ref2/checkpoints/global_step10" ||
        bad "resumes of the 2-rank shards failed: $(tail -3 "$T/re_nv.log")"
    has "$T/re_nv.log" "resuming from $T/np_nv2/checkpoints/global_step10" "2 ranks' shards resume on one process"
    same_state re_nv re_cpu && ok "2 ranks' shards at step 10 resumed on one process: the bits of the same resume under offload to host memory" ||
        bad "shards resumed: bits differ"
else
    echo "skip mpirun checks: mpirun or build/libctrain_mpi.so missing"
fi

# ---- errors ----
err_run() { run err 3MiB --set train.max_steps=1 "$@"; }
err_run --set zero_optimization.offload_optimizer.nvme_path="$T/none"
eq "nvme_path missing: exit code" "$?" 2
has "$T/err.log" "zero_optimization.offload_optimizer.nvme_path: $T/none: No such file or directory" "a missing nvme_path is named"
touch "$T/afile"
err_run --set zero_optimization.offload_optimizer.nvme_path="$T/afile"
eq "nvme_path a file: exit code" "$?" 2
has "$T/err.log" "nvme_path: $T/afile: not a directory" "an nvme_path that is a file is named"
mkdir -p "$T/ro"
if unshare -m true 2>/dev/null; then
    unshare -m sh -c "mount --bind '$T/ro' '$T/ro' && mount -o remount,bind,ro '$T/ro' &&
        CTRAIN_CAPPED_DEVICE=3MiB '$B' --config '$T/gpt.json' --set train.run_dir='$T/err' --set train.max_steps=1 \
        --set zero_optimization.offload_optimizer.nvme_path='$T/ro' >'$T/err.log' 2>&1"
    eq "nvme_path read-only: exit code" "$?" 2
    has "$T/err.log" "nvme_path: $T/ro: cannot create files in it: Read-only file system" "a read-only nvme_path is named"
else
    echo "skip the read-only nvme_path: no mount namespace here (unshare -m)"
fi
(ulimit -f 1000 && err_run) # the swap's 1.6 MiB files over a 500 KiB file-size limit
eq "a file-size limit below the swap's files: exit code" "$?" 1
has "$T/err.log" "$NV/ctrain-swap-optimizer-rank0-.*/master.swap: cannot reserve 1.6 MiB" "the swap file that does not fit is named"
swap_empty "$NV" && ok "nothing left in nvme_path after the failure" || bad "left in $NV: $(ls "$NV")"
err_run --set optimizer.type=Lamb
eq "Lamb with NVMe offload: exit code" "$?" 2
has "$T/err.log" "optimizer Lamb with zero_optimization.offload_optimizer" "Lamb with NVMe offload is refused, saying why"
err_run --set zero_optimization.stage=3 --set zero_optimization.offload_param.device=nvme \
    --set zero_optimization.offload_param.nvme_path="$NV"
eq "offload_param nvme: exit code" "$?" 2
has "$T/err.log" "zero_optimization.offload_param.device: \"nvme\" is not supported for parameters" "offload_param nvme is refused by name"

# ---- dry run: the swap planned, nvme_path checked ----
CTRAIN_CAPPED_DEVICE=1600KiB "$B" --config "$T/gpt.json" --set bf16.enabled=true --dry-run >"$T/dry.log" 2>&1
has "$T/dry.log" "NVMe swap: 4.9 MiB of files under $NV" "dry run: the swap's files and buffers"
CTRAIN_CAPPED_DEVICE=1600KiB "$B" --config "$T/gpt.json" --set zero_optimization.offload_optimizer.nvme_path="$T/none" \
    --dry-run >"$T/dry.log" 2>&1
eq "dry run with a missing nvme_path: exit code" "$?" 2

[ $fails -eq 0 ] && echo "all NVMe offload checks passed" || { echo "$fails failed"; exit 1; }
