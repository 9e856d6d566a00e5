#!/bin/sh
# End-to-end NCCL communicator on one GPU (run by `make test-cuda` / gpu_check only): with
# CTRAIN_COMM=nccl a run of one rank goes through cuda/cuda_comm_nccl.cu (the communicator's
# creation, the gradient all-reduce in buckets on the compute stream, the host values over a device
# buffer, the watchdog's events), which over one rank must change nothing: 20 steps of a small MLP,
# fp32 and fp16 (whose first steps overflow and are skipped), in one bucket and in 3, give the bytes
# of the model and the train loss of the same run without NCCL. ZeRO stages 1-3 partition nothing
# over one rank, so their NCCL groups need two GPUs, which this does not check. Also: a missing NCCL
# library is an error naming CTRAIN_NCCL_LIBRARY.
# libnccl.so.2: CTRAIN_NCCL_LIBRARY, else the loader's path, else PyTorch's wheel (nvidia/nccl/lib).
# Usage: e2e_cuda_nccl.sh BUILD_DIR. Exit 77 (skipped) without a GPU or without NCCL.
set -u
BUILD=${1:-build}
B=$BUILD/ctrain
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || { echo "no CUDA device: skipped"; exit 77; }
if [ -z "${CTRAIN_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
    lib=""
    for d in $(python3 -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null); do
        [ -f "$d/nvidia/nccl/lib/libnccl.so.2" ] && lib="$d/nvidia/nccl/lib/libnccl.so.2" && break
    done
    [ -n "$lib" ] || { echo "no libnccl.so.2 (set CTRAIN_NCCL_LIBRARY): skipped"; exit 77; }
    export CTRAIN_NCCL_LIBRARY="$lib"
fi
. test/lib_e2e.sh
scratch_dir

random_csv "$T/train.csv" 300 13 5 7
cat >"$T/mlp.json" <<EOF
{"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 5,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}, "gradient_clipping": 1.0,
 "model": {"input": [13], "layers": [{"type": "linear", "name": "fc1", "out": 6}, {"type": "tanh", "name": "t"},
           {"type": "linear", "name": "fc2", "out": 5}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "workers": 1},
 "train": {"max_steps": 20, "seed": 3, "device": "cuda", "save_interval": 20}}
EOF
# run NAME ARGS...: a GPU run into $T/NAME (its summary line in $T/NAME.out)
run() {
    name=$1; shift
    "$B" --config "$T/mlp.json" --set train.run_dir=\""$T/$name"\" --summary - "$@" >"$T/$name.out" 2>"$T/$name.err"
}
for prec in fp32 fp16; do
    p=""; [ $prec = fp16 ] && p="--set fp16.enabled=true --set fp16.initial_scale_power=24"
    # shellcheck disable=SC2086 # p is empty or two words
    run "plain_$prec" $p || { bad "plain $prec run (exit $?)"; tail -3 "$T/plain_$prec.err"; continue; }
    for bucket in 500000000 50; do
        r="nccl_${prec}_bucket$bucket"
        # shellcheck disable=SC2086
        if CTRAIN_COMM=nccl run "$r" $p --set zero_optimization.reduce_bucket_size=$bucket; then
            ok "$r: trains with CTRAIN_COMM=nccl"
        else
            bad "$r (exit $?)"; tail -3 "$T/$r.err"; continue
        fi
        cmp -s "$T/plain_$prec/checkpoints/global_step20/model.safetensors" "$T/$r/checkpoints/global_step20/model.safetensors" &&
            ok "$r: the same model bytes as without NCCL" || bad "$r: the model differs from the run without NCCL"
        a=$(summary_loss "$T/plain_$prec.out") b=$(summary_loss "$T/$r.out")
        [ -n "$a" ] && [ "$a" = "$b" ] && ok "$r: train and eval loss $b, as without NCCL" ||
            bad "$r: train and eval loss $b, without NCCL $a"
    done
done
CTRAIN_NCCL_LIBRARY=/nonexistent/libnccl.so.2 CTRAIN_COMM=nccl run missing
rc=$?
[ $rc -eq 1 ] && ok "a missing NCCL library: exit 1" || bad "a missing NCCL library: exit $rc, expected 1"
has "$T/missing.err" "CTRAIN_NCCL_LIBRARY" "a missing NCCL library: the message names CTRAIN_NCCL_LIBRARY"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
