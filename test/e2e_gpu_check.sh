#!/bin/sh
# The GPU scripts' own logic on a machine without a GPU: every test/e2e_cuda*.sh that takes the
# stand-in (it calls cuda_or_standin, test/lib_e2e.sh) is run with CT_CUDA_STANDIN=capped, on the
# CPU's capped device, so that a wrong grep, a comparison that cannot pass or a config the trainer
# refuses is found here and not in `make gpu-check`'s few minutes of device time. On a GPU the same
# scripts run for real in run_tests.sh's cuda mode (gpu_check.sh's tests phase); this script is not
# run there. A stand-in run that exits 77 (skipped) fails: on the capped device nothing is missing.
# Usage: e2e_gpu_check.sh BUILD_DIR.
set -u
BUILD=${1:-build}
. test/lib_e2e.sh
scratch_dir
n=0
for s in test/e2e_cuda*.sh; do
    [ -f "$s" ] && grep -q '^cuda_or_standin' "$s" || continue
    name=$(basename "$s" .sh)
    n=$((n + 1))
    CT_CUDA_STANDIN=capped sh "$s" "$BUILD" >"$T/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q "(stand-in: the capped device)" "$T/$name.log"; then
        ok "$name on the stand-in: $(tail -n 1 "$T/$name.log")"
    else
        bad "$name on the stand-in: exit $rc"
        grep -E '^FAIL|error' "$T/$name.log" | head -n 20 | sed 's/^/      /'
        tail -n 3 "$T/$name.log" | sed 's/^/      /'
    fi
done
[ $n -ge 1 ] && ok "$n GPU script(s) take the stand-in" || bad "no test/e2e_cuda*.sh calls cuda_or_standin"
[ $fails -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
