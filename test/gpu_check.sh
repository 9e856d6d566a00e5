#!/bin/sh
# gpu_check.sh [DIR]: everything that needs a GPU, in one command, from a bundle (`make bundle`) or a
# build folder, on a machine with the NVIDIA driver and the CUDA toolkit only (`make gpu-check`).
#   1. the device, driver and clocks;
#   2. every library the binaries need resolves (ldd) and the CUDA backend loads;
#   3. every CUDA test and the GPU end-to-end runs (run_tests.sh DIR cuda: a skip is a failure);
#   4. the benchmarks against PyTorch on the same GPU (bench_gpt2_gpu.py, bench_gpu.py; python3
#      with a CUDA torch; GPU_CHECK_TORCH_MODES=eager skips torch.compile, which takes minutes;
#      GPU_CHECK_BENCH, default "gpt2 smollm fmnist ckpt", picks which run (smollm: a Llama of
#      SmolLM-135M's shape, its MFU next to GPT-2's); ckpt: bench_ckpt_gpu.py,
#      activation checkpointing's memory and time on GPT-2 and cpu_checkpointing's cost);
#   5. compute-sanitizer: memcheck on the op tests, memcheck and racecheck on the attention and
#      cross-entropy rows, memcheck on a short captured fp16 run;
#   6. (only when GPU_CHECK_PHASES names cpubf16) the host CPU's native bf16 (issue 18): from a
#      bundle made with BUNDLE_ONEDNN=1 (oneDNN in lib/), on a CPU with AVX512-BF16 or AMX,
#      test_cpu_ops's native bf16 GEMM row, e2e_gemm_paths, and the MLP and CNN in fp32 and bf16
#      against PyTorch's bf16 autocast on the same CPU (bench_cpu.py).
# Ends with one line per phase and "gpu-check: N passed, N failed"; exit 0 only when all passed.
# Fashion-MNIST: the four .gz files in $CT_FMNIST_DIR (default /usr/share/datasets/fashion-mnist);
# when they are elsewhere and that default is writable, they are linked there (the configs name it).
# GPU_CHECK_PHASES (default "device libs tests bench memcheck") picks phases; GPU_CHECK_LOGS names
# a folder that receives each phase's full log (default DIR/gpu-check-logs).
set -u
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
DIR=${1:-bundle}
cd "$DIR" || { echo "gpu-check: no folder $DIR (run make bundle first)"; exit 2; }
LOGS=${GPU_CHECK_LOGS:-$PWD/gpu-check-logs}
PHASES=${GPU_CHECK_PHASES:-device libs tests bench memcheck}
mkdir -p "$LOGS"
results=""; npass=0; nfail=0
phase() {   # phase NAME SECONDS CMD...: run CMD (a command or one of the functions below, run
            # through `sh gpu_check.sh . --run FUNCTION` so that timeout can kill it) with a time
            # limit, its output in LOGS/NAME.log
    name=$1; secs=$2; shift 2
    case " $PHASES " in *" $name "*) ;; *) return 0 ;; esac
    echo "== $name"
    start=$(date +%s)
    case "$1" in
        device_info|libs_resolve|memcheck|bench|cpu_bf16) set -- sh "$SELF" . --run "$1" ;;
    esac
    timeout --kill-after=10 "$secs" "$@" > "$LOGS/$name.log" 2>&1
    rc=$?
    took=$(( $(date +%s) - start ))
    cat "$LOGS/$name.log"
    if [ $rc -eq 0 ]; then npass=$((npass + 1)); results="$results
  PASS  $name (${took}s)"
    else
        [ $rc -eq 124 ] && why="timed out after ${secs}s" || why="exit $rc"
        nfail=$((nfail + 1)); results="$results
  FAIL  $name ($why, ${took}s)"
    fi
}

device_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
        --format=csv || return 1
    nvcc --version 2>/dev/null | tail -n 2
    ./ctrain --version
}

libs_resolve() {
    bad=0
    for f in ctrain lib/*.so test/test_*; do
        [ -f "$f" ] || continue
        case "$f" in *.log) continue ;; esac
        missing=$(ldd "$f" 2>&1 | grep 'not found')
        if [ -n "$missing" ]; then echo "$f: $missing"; bad=1; fi
    done
    for f in lib/libopenblas.so.0; do
        [ -f "$f" ] && { missing=$(ldd "$f" 2>&1 | grep 'not found'); [ -z "$missing" ] || { echo "$f: $missing"; bad=1; }; }
    done
    # the CUDA backend must load: `device: auto` would otherwise train on the CPU without a word
    run=$(mktemp -d)
    ./ctrain --quiet --device cuda --config configs/fmnist_mlp.json --set train.max_steps=5 \
        --set data.eval=null --set train.run_dir="\"$run/run\"" || bad=1
    rm -rf "$run"
    return $bad
}

# sanitize TOOL CMD...: CMD under compute-sanitizer's TOOL, failing on any error it reports
sanitize() {
    tool=$1; shift
    compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 20 "$@"
}

memcheck() {
    command -v compute-sanitizer >/dev/null || { echo "compute-sanitizer not found"; return 1; }
    bad=0
    rows=causal_attention_forward,causal_attention_backward,softmax_xent,rope_gqa_forward,rope_gqa_backward,rmsnorm_backward
    CK_FORK=no sanitize memcheck test/test_cuda_ops || bad=1
    CK_FORK=no CT_TEST_DEVICE=cuda CT_TEST_OPS=$rows sanitize memcheck test/test_ops || bad=1
    CK_FORK=no CT_TEST_DEVICE=cuda CT_TEST_OPS=$rows sanitize racecheck test/test_ops || bad=1
    run=$(mktemp -d)
    sanitize memcheck ./ctrain --quiet --device cuda --config configs/fmnist_mlp.json --set fp16.enabled=true \
        --set train.cuda_graph=true --set train.max_steps=30 --set train.run_dir="\"$run/run\"" || bad=1
    rm -rf "$run"
    return $bad
}

bench() {
    python3 -c 'import torch; assert torch.cuda.is_available()' || { echo "python3 has no CUDA torch"; return 1; }
    case " ${GPU_CHECK_BENCH:-gpt2 smollm fmnist ckpt} " in *" gpt2 "*)
        python3 bench/bench_gpt2_gpu.py --build . --micro-batch 16 --steps 30 --warmup 5 || return 1 ;;
    esac
    # a Llama-shaped model (SmolLM-135M's shape, configs/smollm_135m.json): its MFU next to GPT-2's
    case " ${GPU_CHECK_BENCH:-gpt2 smollm fmnist ckpt} " in *" smollm "*)
        python3 bench/bench_gpt2_gpu.py --model smollm --build . --micro-batch 8 --steps 20 --warmup 5 \
            --modes "${GPU_CHECK_TORCH_MODES:-eager,compile}" || return 1 ;;
    esac
    case " ${GPU_CHECK_BENCH:-gpt2 smollm fmnist ckpt} " in *" ckpt "*)
        python3 bench/bench_ckpt_gpu.py --build . --m 4 --steps 10 --warmup 3 || return 1 ;;
    esac
    case " ${GPU_CHECK_BENCH:-gpt2 smollm fmnist ckpt} " in *" fmnist "*)
        python3 bench/bench_gpu.py --build . --models mlp,cnn --precisions fp32,bf16 --epochs 2 --workers 4 \
            --modes "${GPU_CHECK_TORCH_MODES:-eager,compile}" || return 1 ;;
    esac
}

cpu_bf16() {
    grep -q -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo ||
        { echo "this CPU has neither avx512_bf16 nor amx_bf16: nothing native to check"; return 1; }
    grep -o -w -e avx512_bf16 -e amx_bf16 -e amx_tile /proc/cpuinfo | sort | uniq -c
    grep -m1 'model name' /proc/cpuinfo; nproc
    [ -f lib/libdnnl.so.2 ] || ldconfig -p | grep -q 'libdnnl\.so\.2 ' ||
        { echo "no libdnnl.so.2: make the bundle with BUNDLE_ONEDNN=1"; return 1; }
    bad=0
    test/test_cpu_ops || bad=1
    sh test/e2e_gemm_paths.sh . || bad=1
    python3 -c 'import torch' || { echo "python3 has no torch"; return 1; }
    for flags in "" --bf16; do
        python3 bench/bench_cpu.py --build . --steps "${GPU_CHECK_CPU_STEPS:-100}" --models mlp,cnn \
            --torch-settings 1x1,2x1 $flags || bad=1
    done
    return $bad
}

if [ "${2:-}" = "--run" ]; then "$3"; exit $?; fi

FMNIST=${CT_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
DEFAULT=/usr/share/datasets/fashion-mnist
if [ "$FMNIST" != "$DEFAULT" ] && [ ! -e "$DEFAULT" ]; then
    mkdir -p "$(dirname "$DEFAULT")" 2>/dev/null && ln -s "$(cd "$FMNIST" && pwd)" "$DEFAULT" ||
        echo "gpu-check: cannot link $FMNIST to $DEFAULT; the end-to-end runs will fail"
fi

phase device 60 device_info
phase libs 120 libs_resolve
phase tests 1500 sh test/run_tests.sh . cuda
phase bench 1500 bench
phase memcheck 900 memcheck
phase cpubf16 900 cpu_bf16
echo
echo "gpu-check summary ($(date -u +%Y-%m-%dT%H:%MZ)):$results"
echo "gpu-check: $npass passed, $nfail failed (logs: $LOGS)"
[ $nfail -eq 0 ]
