#!/bin/sh
# test/plants/run.sh [PATCH...]: plant each bug alone and see whether the suite catches it.
# Each patch here is one realistic, single-line bug in a module (a wrong fan, an offset range one
# short, an off-by-one window count...). For each, in a throwaway worktree of HEAD (what is not
# committed is not planted on): apply, build (CUDA=0), run test/run_tests.sh, and report CAUGHT
# (which tests failed), SURVIVED (every test passed: a test is missing) or STALE (the patch no
# longer applies or builds: the code moved; rewrite it). The worktree is removed at the end.
# Minutes per patch, so not part of `make test`.
# Exit 0 when every patch that applies is caught, 1 when one survives, 2 on a usage error.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(git -C "$here" rev-parse --show-toplevel) || exit 2
[ $# -gt 0 ] || set -- "$here"/*.patch
for p in "$@"; do
    [ -f "$p" ] || { echo "run.sh: $p: no such patch" >&2; exit 2; }
done
wt=$(mktemp -d "${TMPDIR:-/tmp}/ct-plants.XXXXXX") || exit 2
trap 'git -C "$root" worktree remove --force "$wt" 2>/dev/null; rm -rf "$wt"' EXIT INT TERM
git -C "$root" worktree add -q --detach "$wt" HEAD || exit 2
caught=0; survived=0; stale=0
for p in "$@"; do
    name=$(basename "$p" .patch)
    p=$(cd "$(dirname "$p")" && pwd)/$(basename "$p")   # git -C runs in the worktree
    if ! git -C "$wt" apply "$p" 2>/dev/null; then
        stale=$((stale + 1)); echo "STALE     $name"; continue
    fi
    if ! make -C "$wt" -j"$(nproc)" CUDA=0 all tests > "$wt/build.log" 2>&1; then
        stale=$((stale + 1)); echo "STALE     $name (does not build; the end of its log:)"; tail -n 5 "$wt/build.log" | sed 's/^/          /'
    else
        failed=$(cd "$wt" && sh test/run_tests.sh build 2>&1 | sed -n 's/^failed: *//p')
        if [ -n "$failed" ]; then caught=$((caught + 1)); echo "CAUGHT    $name by $failed"
        else survived=$((survived + 1)); echo "SURVIVED  $name"; fi
    fi
    git -C "$wt" checkout -q -- .
done
echo "$caught caught, $survived survived, $stale stale"
[ $survived -eq 0 ]
