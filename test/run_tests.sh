#!/bin/sh
# Run every test this machine can run: the Check unit tests (build/test/test_*) and the
# end-to-end scripts (test/e2e_*.sh). Usage: run_tests.sh BUILD_DIR [cpu|quick|cuda]
#   cpu (the default; `make test`, CI): all of them, 5-8 minutes on 2 cores;
#   quick (`make check`): the unit tests and the end-to-end scripts named in QUICK below, which
#     take a few seconds each: under a minute on 2 cores, for day-to-day work;
#   cuda (`make test-cuda`): the GPU tests.
# A test exiting 77 is reported as skipped, never as passed (in cuda mode: as failed). Tests exit
# 77 only for what `make deps` cannot give (a GPU, a CPU feature, a permission); one that finds
# something make deps installs missing fails, naming it. Ends with "N passed, N failed, N skipped".
BUILD=${1:-build}
MODE=${2:-cpu}
# the end-to-end scripts of `make check`: a few seconds each on the 2-core machine (the others
# train for tens of seconds: e2e_amp, e2e_bitwise, e2e_dist, e2e_tiny_lm, ...)
QUICK="e2e_cli e2e_curriculum e2e_fit e2e_generate e2e_limits e2e_llmc_shards e2e_plot e2e_profile e2e_text e2e_token_vocab e2e_webdataset"
# Check's default of 4 s a test case is a hang detector, not a speed test: on a machine shared with
# other builds a fast case (test_rng's moments) has run past it. 30 s still ends a hung case.
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-30}
passed=0; failed=0; skipped=0; failures=""
run_one() {
    name=$1; shift
    start=$(date +%s)
    "$@" > "$BUILD/test/$name.log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - start ))
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS  $name (${secs}s)"
        grep -E '^[0-9]+%: Checks: ' "$BUILD/test/$name.log" | sed 's/^/      /'
    elif [ $rc -eq 77 ] && [ "$MODE" = "cuda" ]; then
        # on the GPU a skip tests nothing: a GPU check that skips has failed
        failed=$((failed + 1)); failures="$failures $name"; echo "FAIL  $name (skipped in cuda mode: $(tail -n 1 "$BUILD/test/$name.log"))"
    elif [ $rc -eq 77 ]; then
        skipped=$((skipped + 1)); echo "SKIP  $name: $(tail -n 1 "$BUILD/test/$name.log")"
    else
        failed=$((failed + 1)); failures="$failures $name"; echo "FAIL  $name (exit $rc, ${secs}s)"
        tail -n 40 "$BUILD/test/$name.log" | sed 's/^/      /'
    fi
}
mkdir -p "$BUILD/test"
t0=$(date +%s)
if [ "$MODE" = "cuda" ]; then
    export CT_TEST_CUDA=1
    for t in "$BUILD"/test/test_cuda*; do [ -x "$t" ] && run_one "$(basename "$t")" "$t"; done
    # the op table's rows, the CUDA backend against the CPU backend
    run_one test_ops_on_cuda env CT_TEST_DEVICE=cuda "$BUILD/test/test_ops"
    # the mixed-precision tests again, with their trainer and optimizer on the GPU
    run_one test_amp_on_cuda env CT_TEST_DEVICE=cuda "$BUILD/test/test_amp"
    # the small GPT against PyTorch (test_train's case "gpt"), fp32 and bf16 on the GPU
    run_one test_train_gpt_on_cuda env CT_TEST_DEVICE=cuda CK_RUN_CASE=gpt "$BUILD/test/test_train"
    for s in test/e2e_cuda*.sh; do [ -f "$s" ] && run_one "$(basename "$s" .sh)" sh "$s" "$BUILD"; done
else
    run_one check_layout sh test/check_layout.sh "$BUILD"
    # its warnings (a module past its budget, a file past 800 lines) are shown when it passes too
    grep '^check_layout: warning' "$BUILD/test/check_layout.log" | sed 's/^check_layout: /      /'
    run_one check_deps sh test/check_deps.sh
    for t in "$BUILD"/test/test_*; do
        case "$t" in *.log) continue ;; esac
        [ -x "$t" ] && run_one "$(basename "$t")" "$t"
    done
    # the op table and the mixed-precision trainer again on the CPU's capped device (a separate
    # device in all but its kernels: the op table bit for bit against the CPU)
    run_one test_ops_on_capped env CT_TEST_DEVICE=capped CTRAIN_CAPPED_DEVICE=4GiB "$BUILD/test/test_ops"
    run_one test_amp_on_capped env CT_TEST_DEVICE=capped CTRAIN_CAPPED_DEVICE=1GiB,gbps=8 "$BUILD/test/test_amp"
    for s in test/e2e_*.sh; do
        name=$(basename "$s" .sh)
        case "$name" in e2e_cuda*) continue ;; esac
        if [ "$MODE" = quick ]; then case " $QUICK " in *" $name "*) ;; *) continue ;; esac; fi
        [ -f "$s" ] && run_one "$name" sh "$s" "$BUILD"
    done
fi
echo
echo "the $MODE tests took $(( $(date +%s) - t0 )) s"
[ -n "$failures" ] && echo "failed:$failures"
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
