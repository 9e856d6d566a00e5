#!/bin/sh
# Every GEMM path the CPU backend can take gives correct results for every op built on GEMM, on
# every instruction set this CPU can be held to: the op table's GEMM, convolution and attention
# rows (test_ops: fp64 references, 1 vs 2 threads bit for bit) and test_cpu_ops's per-library GEMM
# checks, with
#   - CTRAIN_CPU_GEMM=openblas: OpenBLAS alone (bf16 widened);
#   - CTRAIN_CPU_GEMM=onednn: oneDNN alone, at the highest instruction set oneDNN finds, then held
#     by ONEDNN_MAX_CPU_ISA to each lower level this CPU has among AMX, AVX512-BF16, AVX-512, AVX2
#     and SSE4.1 (oneDNN picks its kernels, so its summation order, and whether it has a bf16
#     matmul at all, by that level; ctrain takes the native bf16 path only where oneDNN makes one);
#   - the bf16 GEMM's own switches (CTRAIN_CPU_BF16): widen (the fp32 GEMM on widened operands,
#     which test_ops checks bit for bit against the fp32 op) and emulate (the native path with
#     AVX512-BF16's arithmetic written out in C: what a native CPU runs differently, on any CPU).
# test_ops says which bf16 path each run took; a CPU can be held down, never up, so this script
# ends by naming the levels it could not run here.
# bf16 training (core/cpu/cpu_onednn_bf16.c): the start block says how bf16 products run (natively
# on a CPU with AVX512-BF16/AMX, else in fp32, and why), CTRAIN_CPU_BF16=widen turns native off, and
# the native (or emulated) path's training matches the widened one's to bf16 precision.
# The default (auto: per shape, core/cpu/cpu_gemm.c) runs in the suite's own test_ops. oneDNN
# (libdnnl2) is a dependency `make deps` installs: without it the oneDNN runs fail, naming it.
# Usage: e2e_gemm_paths.sh BUILD_DIR
set -u
BUILD=${1:-build}
. test/lib_e2e.sh
ROWS=gemm,gemm_16bit,gemm_batched,conv2d_forward,conv2d_backward,causal_attention_forward,causal_attention_backward
FEW=gemm,gemm_16bit,gemm_batched,conv2d_forward,conv2d_backward
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# run NAME ROWS ENV...: test_ops' ROWS and test_cpu_ops under ENV; the bf16 path test_ops reports
run() {
    name=$1; rows=$2; shift 2
    if env "$@" CT_TEST_OPS="$rows" "$BUILD/test/test_ops" >"$T/ops" 2>&1 &&
        env "$@" "$BUILD/test/test_cpu_ops" >"$T/cpu" 2>&1; then
        ok "$name: test_ops $rows (fp64 references, 1 vs 2 threads); test_cpu_ops"
        sed -n 's/^test_ops: bf16 x bf16 GEMMs: /       bf16: /p' "$T/ops"
    else
        bad "$name"; tail -n 8 "$T/ops" "$T/cpu" | sed 's/^/     /'
    fi
}
run "OpenBLAS alone" "$ROWS" CTRAIN_CPU_GEMM=openblas

# oneDNN's levels (ONEDNN_MAX_CPU_ISA) that change a kernel ctrain uses, highest first, with the
# /proc/cpuinfo flags each needs (AVX512_CORE_VNNI is left out: it adds int8 instructions only)
LEVELS="AVX512_CORE_AMX:amx_bf16 AVX512_CORE_BF16:avx512_bf16 AVX512_CORE:avx512f,avx512bw,avx512vl,avx512dq AVX2:avx2 SSE41:sse4_1"
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has_flags() { # FLAG,FLAG...: this CPU has every one
    for f in $(echo "$1" | tr ',' ' '); do case $flags in *" $f "*) ;; *) return 1 ;; esac; done
}
if [ -e /usr/lib/x86_64-linux-gnu/libdnnl.so.2 ] || [ -e "$BUILD/lib/libdnnl.so.2" ] ||
    ldconfig -p 2>/dev/null | grep -q 'libdnnl\.so\.2 '; then
    top="" unchecked=""
    for level in $LEVELS; do
        isa=${level%%:*} need=${level#*:}
        if ! has_flags "$need"; then unchecked="$unchecked $isa"; continue; fi
        if [ -z "$top" ]; then   # the highest level here: oneDNN unheld, every row
            top=$isa
            run "oneDNN alone (up to $isa)" "$ROWS" CTRAIN_CPU_GEMM=onednn
        else
            run "oneDNN held to $isa" "$FEW" CTRAIN_CPU_GEMM=onednn ONEDNN_MAX_CPU_ISA=$isa
        fi
    done
    [ -n "$unchecked" ] &&
        echo "not checked on this CPU (it lacks them; a CPU can be held down, not up): oneDNN's kernels for$unchecked"
else
    bad "missing dependency: oneDNN (libdnnl.so.2, Debian's libdnnl2; make deps installs it)"
fi

# the bf16 GEMM's switches: widened (bit for bit the fp32 op), and the native path emulated
run "bf16 widened (CTRAIN_CPU_BF16=widen)" gemm_16bit CTRAIN_CPU_BF16=widen
grep -q "gemm_16bit .*on the CPU's native bf16 path" "$T/ops" && bad "CTRAIN_CPU_BF16=widen: test_ops ran a case natively"
run "bf16 native path, emulated (CTRAIN_CPU_BF16=emulate)" gemm_16bit CTRAIN_CPU_BF16=emulate
grep -q "gemm_16bit .* on the CPU's native bf16 path" "$T/ops" &&
    ok "emulated: gemm_16bit's bf16 x bf16 cases took the native path" ||
    bad "emulated: no case of gemm_16bit took the native path: $(grep gemm_16bit "$T/ops")"
if grep -q -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo 2>/dev/null; then
    echo "this CPU multiplies bf16 natively: the runs above checked its own path (bf16: lines)"
else
    echo "not checked on this CPU: the native bf16 instructions themselves (no avx512_bf16 or amx_bf16);" \
        "their path ran with the arithmetic emulated in C (CTRAIN_CPU_BF16=emulate)"
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
# bf16 training, as the CPU allows (auto), always widened, and emulated: 20 MLP steps each
bf16_run() { # NAME CTRAIN_CPU_BF16-VALUE: $T/NAME.out, $T/NAME.json
    CTRAIN_CPU_BF16=$2 "$BUILD/ctrain" --config configs/fmnist_mlp.json --set bf16.enabled=true \
        --set train.max_steps=20 --set train.eval_interval=0 --set data.eval.limit=1000 \
        --set train.run_dir="$T/$1" --summary "$T/$1.json" >"$T/$1.out" 2>&1
}
# close_loss NAME: NAME's train loss within 2% of the widened run's (other summation orders, then 20
# steps of bf16 rounding: the same training, not the same bits)
close_loss() {
    l=$(summary_loss "$T/$1.json" | cut -d' ' -f1)
    if awk -v a="$l" -v w="$widen_loss" 'BEGIN { d = a - w; if (d < 0) d = -d; exit !(d < 0.02 * w) }'; then
        ok "bf16 $1: train loss $l, widened $widen_loss (within 2%)"
    else
        bad "bf16 $1: train loss $l, widened $widen_loss"
    fi
}
if bf16_run auto auto && bf16_run widen widen && bf16_run emulate emulate; then
    has "$T/widen.out" "note   bf16 is computed in fp32 on the CPU (CTRAIN_CPU_BF16=widen)" "bf16 widened: the start block says so"
    has "$T/emulate.out" "note   bf16 matrix products are emulated in C" "bf16 emulated: the start block says so"
    widen_loss=$(summary_loss "$T/widen.json" | cut -d' ' -f1)
    close_loss emulate
    if grep -q "note   bf16 matrix products run natively" "$T/auto.out"; then
        close_loss auto
    else
        has "$T/auto.out" "note   bf16 is computed in fp32" "bf16 on a CPU without native bf16: the start block says so"
        auto_loss=$(summary_loss "$T/auto.json" | cut -d' ' -f1)
        [ "$auto_loss" = "$widen_loss" ] && ok "bf16 auto = widened here (train loss $auto_loss)" ||
            bad "bf16 auto $auto_loss != widened $widen_loss on a CPU without native bf16"
    fi
else
    bad "a bf16 run failed"; tail -n 5 "$T/auto.out" "$T/widen.out" "$T/emulate.out" | sed 's/^/     /'
fi
[ "$fails" -eq 0 ]
