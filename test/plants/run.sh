#!/bin/sh
# test/plants/run.sh [--full] [--list] [PATCH...]: plant each bug alone and see whether a test
# catches it. Each patch here is one realistic, single-line bug in a module (README.md lists them).
# For each, in a throwaway worktree of HEAD (what is not committed is not planted on): apply,
# build (CUDA=0, with ccache when installed), run the tests its header names, and report
#   CAUGHT    (which tests failed),
#   SURVIVED  (every test passed: a test is missing),
#   STALE     (the patch no longer applies, or no longer builds: the code moved; rewrite it).
# The worktree is removed at the end.
#
# A patch starts with a header that git apply skips, above its diff:
#   # plant: what the bug is
#   # tests: test_graph_memory test_train:generate e2e_generate
# naming the tests that must catch it: build/test/NAME, NAME:CASE (Check's CK_RUN_CASE=CASE of
# build/test/NAME), or test/NAME.sh (e2e_*, check_*). By default a plant runs just those (the
# machine is shared: a plant costs seconds, not the suite's minutes); --full runs the whole CPU
# suite (test/run_tests.sh) for each instead, as CI would. --list prints every patch's header.
#
# Cost on the shared 2-core machine (2026-11-28, ccache warm): the 37 patches with their named
# tests, 6-9 min (354 s and 510 s in two campaigns: 2-56 s a plant, 60-111 s for the two run by
# e2e_gemm_paths, the first plant's build of the worktree mostly ccache hits); --full,
# 6.5 min a plant (392 s measured: the suite's 400 s), about 4 hours for all 37, so neither is
# part of `make test`.
#
# Exit 0 when every patch is caught; 1 when any survived or is stale (each named at the end: a
# plant that rots fails the run); 2 on a usage error (a missing patch, a patch without a tests
# line when not --full).
set -u
unset CK_RUN_CASE CK_RUN_SUITE
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel) || exit 2
full=0 list=0
while [ $# -gt 0 ]; do
    case "$1" in
    --full) full=1; shift ;;
    --list) list=1; shift ;;
    --) shift; break ;;
    -*) echo "run.sh: unknown option $1 (usage: run.sh [--full] [--list] [PATCH...])" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || set -- "$here"/*.patch
# header FIELD PATCH: the value of "# FIELD: ..." in the patch's header (before its diff)
header() { sed -n "/^diff --git /q; s/^# $1: *//p" "$2" | head -n 1; }
for p in "$@"; do
    [ -f "$p" ] || { echo "run.sh: $p: no such patch" >&2; exit 2; }
    if [ $full -eq 0 ] && [ -z "$(header tests "$p")" ]; then
        echo "run.sh: $p: no \"# tests:\" line in its header (name the tests that catch it, or use --full)" >&2
        exit 2
    fi
done
if [ $list -eq 1 ]; then
    for p in "$@"; do printf '%-40s %s\n    tests: %s\n' "$(basename "$p" .patch)" "$(header plant "$p")" "$(header tests "$p")"; done
    exit 0
fi
# the tests' Python environment (make deps) lives in the checkout, not in the throwaway worktree
[ -z "${CT_TEST_VENV:-}" ] && [ -d "$root/.venv" ] && export CT_TEST_VENV="$root/.venv"
cc=${CC:-cc}
command -v ccache >/dev/null 2>&1 && [ -z "${CC:-}" ] && cc="ccache cc"
jobs=$(nproc 2>/dev/null || echo 2)
wt=$(mktemp -d "${TMPDIR:-/tmp}/ct-plants.XXXXXX") || exit 2
trap 'git -C "$root" worktree remove --force "$wt" 2>/dev/null; rm -rf "$wt"' EXIT
trap 'exit 130' INT TERM
git -C "$root" worktree add -q --detach "$wt" HEAD || exit 2

# run_test ENTRY: run one named test in the worktree; its log in $wt/plant-test.log. Prints
# "failed", "passed" or "skipped". A test that hangs past 15 minutes counts as failed.
run_test() {
    name=${1%%:*} ck_case=
    [ "$name" != "$1" ] && ck_case=${1#*:}
    if [ -x "$wt/build/test/$name" ]; then
        # (an empty CK_RUN_CASE would run no case at all)
        (cd "$wt" && if [ -n "$ck_case" ]; then export CK_RUN_CASE="$ck_case"; fi
         timeout 900 "build/test/$name") > "$wt/plant-test.log" 2>&1
    elif [ -f "$wt/test/$name.sh" ]; then
        (cd "$wt" && timeout 900 sh "test/$name.sh" build) > "$wt/plant-test.log" 2>&1
    else
        echo "missing"; return
    fi
    case $? in 0) echo passed ;; 77) echo skipped ;; *) echo failed ;; esac
}

# targets PATCH: what to build for it: the named unit tests alone (linking every test program
# costs more than the tests), ctrain for end-to-end scripts, everything for --full
targets() {
    [ $full -eq 1 ] && { echo all tests; return; }
    for t in $(header tests "$1"); do
        n=${t%%:*}
        case $n in
        test_*) echo "build/test/$n" ;;
        check_layout) echo all ;;   # the objects whose symbols it reads
        e2e_*) echo all
               # the scripts that run helper programs of build/test (hdf5_probe, fake libraries)
               grep -Eq '(build|BUILD|\$B|\$\{?1\}?)/test/' "$wt/test/$n.sh" 2>/dev/null && echo tests ;;
        esac
    done | sort -u
}

t_start=$(date +%s)
caught=0 survived=0 stale=0 bad=""
for p in "$@"; do
    name=$(basename "$p" .patch)
    p=$(cd "$(dirname "$p")" && pwd)/$(basename "$p")   # git -C runs in the worktree
    t0=$(date +%s)
    if ! git -C "$wt" apply "$p" 2>/dev/null; then
        stale=$((stale + 1)) bad="$bad $name"
        echo "STALE     $name (no longer applies: rewrite it against the code as it is)"
        continue
    fi
    if ! make -C "$wt" -j"$jobs" CC="$cc" CUDA=0 $(targets "$p") > "$wt/build.log" 2>&1; then
        stale=$((stale + 1)) bad="$bad $name"
        echo "STALE     $name (does not build; the end of its log:)"
        tail -n 5 "$wt/build.log" | sed 's/^/          /'
    else
        failed="" notes=""
        if [ $full -eq 1 ]; then
            failed=$(cd "$wt" && sh test/run_tests.sh build 2>&1 | sed -n 's/^failed:/ /p')
        else
            for t in $(header tests "$p"); do
                r=$(run_test "$t")
                case $r in
                failed) failed="$failed $t" ;;
                skipped) notes="$notes, $t skipped" ;;
                missing) notes="$notes, no test $t"; bad="$bad $name" ;;
                esac
            done
        fi
        secs=$(( $(date +%s) - t0 ))
        if [ -n "$failed" ]; then
            caught=$((caught + 1)); echo "CAUGHT    $name by${failed} (${secs}s${notes})"
        else
            survived=$((survived + 1)) bad="$bad $name"; echo "SURVIVED  $name (${secs}s${notes})"
        fi
    fi
    git -C "$wt" checkout -q -- .
done
echo "$caught caught, $survived survived, $stale stale in $(( $(date +%s) - t_start )) s"
[ -z "$bad" ] || { echo "not caught:$bad"; exit 1; }
exit 0
