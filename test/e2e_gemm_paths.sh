#!/bin/sh
# Every GEMM library the CPU backend can pick gives correct results for every op built on GEMM:
# the op table's GEMM, convolution and attention rows (test_ops: fp64 references, 1 vs 2 threads
# bit for bit) and test_cpu_ops's per-library GEMM check, with CTRAIN_CPU_GEMM forcing OpenBLAS, then
# oneDNN, then oneDNN held to SSE4.1 (ONEDNN_MAX_CPU_ISA; GEMM and convolution rows), as on a CPU
# without AVX2 or AVX-512.
# bf16 (core/cpu/cpu_onednn_bf16.c): the start block says how bf16 products run (natively on a CPU
# with AVX512-BF16/AMX, else in fp32, and why), CTRAIN_CPU_BF16=widen turns native off, and where
# native is taken its training matches the widened one's to bf16 precision.
# The default (auto: per shape, core/cpu/cpu_gemm.c) runs in the suite's own test_ops. Without
# oneDNN (libdnnl.so.2) its runs are skipped, saying so. Usage: e2e_gemm_paths.sh BUILD_DIR
set -u
BUILD=${1:-build}
. test/lib_e2e.sh
ROWS=gemm,gemm_16bit,gemm_batched,conv2d_forward,conv2d_backward,causal_attention_forward,causal_attention_backward
FEW=gemm,gemm_batched,conv2d_forward,conv2d_backward
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# run NAME ROWS ENV...: test_ops' ROWS and test_cpu_ops under ENV
run() {
    name=$1; rows=$2; shift 2
    if env "$@" CT_TEST_OPS="$rows" "$BUILD/test/test_ops" >"$T/ops" 2>&1 &&
        env "$@" "$BUILD/test/test_cpu_ops" >"$T/cpu" 2>&1; then
        ok "$name: test_ops $rows (fp64 references, 1 vs 2 threads); test_cpu_ops"
    else
        bad "$name"; tail -n 8 "$T/ops" "$T/cpu" | sed 's/^/     /'
    fi
}
run "OpenBLAS alone" "$ROWS" CTRAIN_CPU_GEMM=openblas
if [ -e /usr/lib/x86_64-linux-gnu/libdnnl.so.2 ] || ldconfig -p 2>/dev/null | grep -q 'libdnnl\.so\.2 '; then
    run "oneDNN alone" "$ROWS" CTRAIN_CPU_GEMM=onednn
    run "oneDNN held to SSE4.1" "$FEW" CTRAIN_CPU_GEMM=onednn ONEDNN_MAX_CPU_ISA=SSE41
else
    echo "skip oneDNN runs: libdnnl.so.2 not installed (apt-get install libdnnl2)"
fi
# a library that CTRAIN_CPU_GEMM cannot name is an error that says what to set
if CTRAIN_CPU_GEMM=mkl "$BUILD/ctrain" --config configs/fmnist_mlp.json --set train.max_steps=1 \
    --set train.run_dir="$T/run" >"$T/out" 2>&1; then
    bad "CTRAIN_CPU_GEMM=mkl was accepted"
else
    has "$T/out" "CTRAIN_CPU_GEMM=\"mkl\" names no GEMM library" "CTRAIN_CPU_GEMM=mkl: an error naming the variable"
fi
if CTRAIN_CPU_BF16=fast "$BUILD/ctrain" --config configs/fmnist_mlp.json --set train.max_steps=1 \
    --set train.run_dir="$T/run" >"$T/out" 2>&1; then
    bad "CTRAIN_CPU_BF16=fast was accepted"
else
    has "$T/out" "CTRAIN_CPU_BF16=\"fast\" is not a choice" "CTRAIN_CPU_BF16=fast: an error naming the variable"
fi
# bf16 training, as the CPU allows (auto) and always widened: 20 MLP steps each
bf16_run() { # NAME CTRAIN_CPU_BF16-VALUE: $T/NAME.out, $T/NAME.json
    CTRAIN_CPU_BF16=$2 "$BUILD/ctrain" --config configs/fmnist_mlp.json --set bf16.enabled=true \
        --set train.max_steps=20 --set train.eval_interval=0 --set train.run_dir="$T/$1" \
        --summary "$T/$1.json" >"$T/$1.out" 2>&1
}
if bf16_run auto auto && bf16_run widen widen; then
    has "$T/widen.out" "note   bf16 is computed in fp32 on the CPU (CTRAIN_CPU_BF16=widen)" "bf16 widened: the start block says so"
    auto_loss=$(summary_loss "$T/auto.json" | cut -d' ' -f1) widen_loss=$(summary_loss "$T/widen.json" | cut -d' ' -f1)
    if grep -q "note   bf16 matrix products run natively" "$T/auto.out"; then
        # other summation orders, then 20 steps of bf16 rounding: the same training, not the same bits
        if awk -v a="$auto_loss" -v w="$widen_loss" 'BEGIN { d = a - w; if (d < 0) d = -d; exit !(d < 0.02 * w) }'; then
            ok "bf16 native: train loss $auto_loss, widened $widen_loss (within 2%)"
        else
            bad "bf16 native: train loss $auto_loss, widened $widen_loss"
        fi
    else
        has "$T/auto.out" "note   bf16 is computed in fp32" "bf16 on a CPU without native bf16: the start block says so"
        [ "$auto_loss" = "$widen_loss" ] && ok "bf16 auto = widened here (train loss $auto_loss)" ||
            bad "bf16 auto $auto_loss != widened $widen_loss on a CPU without native bf16"
    fi
else
    bad "a bf16 run failed"; tail -n 5 "$T/auto.out" "$T/widen.out" | sed 's/^/     /'
fi
[ "$fails" -eq 0 ]
