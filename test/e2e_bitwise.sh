#!/bin/sh
# Training results are bit-for-bit those recorded in test/ref/bitwise/sha256: 200 steps of the
# Fashion-MNIST MLP and CNN in fp32, fp16 and bf16, hashed over the final model.safetensors. A
# refactor that changes a single bit of one weight fails here. Update the file only in a commit
# whose purpose is to change the numbers (and say why in its message):
#   sh test/e2e_bitwise.sh build --record
# OpenBLAS picks its GEMM kernels by CPU (an AVX-512 kernel and an AVX2 kernel sum in different
# orders), so the runs pin its AVX2 kernels: the hashes then hold on any x86-64 machine with AVX2.
# They also pin every GEMM to OpenBLAS (CTRAIN_CPU_GEMM): oneDNN, which takes most shapes where it is
# installed (core/cpu/cpu_gemm.c), picks its kernels (so its summation order) by the instruction
# set it finds, so recorded hashes of its runs would hold on machines like this one only. Its
# results do not depend on the thread count either (test_train's 1 vs 2 threads and
# test/e2e_gemm_paths.sh run with it). And they pin bf16 GEMMs to the widened path
# (CTRAIN_CPU_BF16=widen): on a CPU with AVX512-BF16 or AMX the native path sums in its own order
# (core/cpu/cpu_onednn_bf16.c), so its bits are that CPU's; test_ops and e2e_gemm_paths check it
# against fp64 instead. (CTRAIN_CPU_GEMM=openblas alone turns native off too; widen says so here.)
# Usage: e2e_bitwise.sh BUILD_DIR [--record]. Fails without Fashion-MNIST (make deps installs it);
# exit 77 (skipped) on a CPU without AVX2.
set -u
B=${1:-build}/ctrain
REF=test/ref/bitwise/sha256
D=/usr/share/datasets/fashion-mnist
[ -f "$D/train-images-idx3-ubyte.gz" ] || { echo "FAIL missing dependency: Fashion-MNIST ($D: Debian's dataset-fashion-mnist); make deps installs it"; exit 1; }
grep -q avx2 /proc/cpuinfo 2>/dev/null || { echo "no AVX2: the recorded hashes need OpenBLAS's AVX2 kernels"; exit 77; }
export OPENBLAS_CORETYPE=Haswell CTRAIN_CPU_GEMM=openblas CTRAIN_CPU_BF16=widen
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. test/lib_e2e.sh
for model in mlp cnn; do
    for prec in fp32 fp16 bf16; do
        case $prec in fp16) p="--set fp16.enabled=true" ;; bf16) p="--set bf16.enabled=true" ;; *) p="" ;; esac
        # shellcheck disable=SC2086
        "$B" --quiet --config configs/fmnist_$model.json --set train.max_steps=200 \
            --set data.eval.limit=100 --set train.run_dir="$T/$model-$prec" $p >/dev/null 2>"$T/err"
        f="$T/$model-$prec/checkpoints/global_step200/model.safetensors"
        if [ ! -f "$f" ]; then bad "$model $prec: no checkpoint"; sed 's/^/     /' "$T/err" | tail -5; continue; fi
        echo "$model-$prec $(sha256sum "$f" | cut -d' ' -f1)" >>"$T/got"
    done
done
if [ "${2:-}" = "--record" ]; then
    cp "$T/got" "$REF" && echo "recorded $REF:" && cat "$REF"
    exit 0
fi
while read -r name want; do
    got=$(awk -v n="$name" '$1 == n {print $2}' "$T/got")
    if [ "$got" = "$want" ]; then ok "$name: final weights bitwise as recorded"; else bad "$name: sha256 ${got:-none}, recorded $want"; fi
done <"$REF"
[ "$fails" -eq 0 ]
