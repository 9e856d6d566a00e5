#!/bin/sh
# Make the Python virtual environment the tests use: `make deps` and `make deps-test` (which `make
# test` and `make check` run when it is missing or out of date). DIR (the Makefile's VENV, .venv/)
# is made by Debian's python3 with --system-site-packages, so the Debian packages of DEB_PKGS
# (numpy, h5py, Pillow) stay visible in it, and gets the pinned packages of REQUIREMENTS from PyPI
# (pip --no-deps: REQUIREMENTS lists every package, dependencies included). A copy of REQUIREMENTS
# in DIR/.requirements marks it complete; the tests run DIR/bin/python.
#
# Usage: venv.sh [--check] [--log FILE] DIR REQUIREMENTS
#   --check     change nothing: exit 1, saying why, unless DIR is complete for REQUIREMENTS
#   --log FILE  where the output of venv and pip goes (default: a new temporary file); the terminal
#               gets one line per step, and on a failure the file's path and its last 20 lines
# $VENV_PYTHON: the python that makes DIR (default /usr/bin/python3, Debian's: a python3 earlier on
# PATH, from pyenv say, would not see Debian's packages). Exit status: 0 when DIR is complete, 1
# when it is not (--check) or pip failed, 2 when no environment can be made here (no python3, or no
# venv module: Debian's python3-venv, which `make deps` installs).
set -eu
check_only=0
log=""
while [ $# -gt 0 ]; do
    case $1 in
    --check) check_only=1; shift ;;
    --log) [ $# -ge 2 ] || { echo "venv: --log needs a file" >&2; exit 2; }; log=$2; shift 2 ;;
    -*) echo "venv: unknown option $1 (usage: venv.sh [--check] [--log FILE] DIR REQUIREMENTS)" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -eq 2 ] || { echo "venv: usage: venv.sh [--check] [--log FILE] DIR REQUIREMENTS" >&2; exit 2; }
dir=$1 reqs=$2
[ -f "$reqs" ] || { echo "venv: $reqs: no such file" >&2; exit 2; }
python=${VENV_PYTHON:-/usr/bin/python3}

# complete: DIR's python runs and DIR/.requirements is REQUIREMENTS
complete() {
    "$dir/bin/python" -c "" >/dev/null 2>&1 && cmp -s "$reqs" "$dir/.requirements"
}
if complete; then
    [ $check_only -eq 1 ] || echo "venv: $dir has the packages of $reqs"
    exit 0
fi
if [ $check_only -eq 1 ]; then
    if [ ! -e "$dir/bin/python" ]; then echo "venv: no environment in $dir (make deps-test makes it)"
    elif ! "$dir/bin/python" -c "" >/dev/null 2>&1; then echo "venv: $dir/bin/python does not run (make deps-test makes it again)"
    else echo "venv: $dir does not have the packages of $reqs yet (make deps-test installs them)"; fi
    exit 1
fi

[ -x "$python" ] || { echo "venv: $python not found: install Debian's python3 (make deps), or set VENV_PYTHON" >&2; exit 2; }
if ! "$python" -c "import venv, ensurepip" >/dev/null 2>&1; then
    echo "venv: $python cannot make virtual environments (no venv or ensurepip module):" >&2
    echo "venv: install Debian's python3-venv (make deps does), then run this again." >&2
    exit 2
fi
if [ -z "$log" ] || ! { mkdir -p "$(dirname "$log")" && : >"$log"; } 2>/dev/null; then
    log=$(mktemp "${TMPDIR:-/tmp}/ctrain-venv.XXXXXX")
fi
fail() {
    echo "venv: $1; the output is in $log, which ends with:" >&2
    tail -n 20 "$log" | sed 's/^/    /' >&2
    exit 1
}
if ! "$dir/bin/python" -c "" >/dev/null 2>&1; then
    # a new environment, or one whose python no longer runs (python3 was upgraded): made again
    echo "venv: making $dir ($python -m venv --system-site-packages; output in $log)"
    rc=0
    "$python" -m venv --clear --system-site-packages "$dir" >>"$log" 2>&1 || rc=$?
    [ $rc -eq 0 ] || fail "$python -m venv failed (exit $rc)"
fi
rm -f "$dir/.requirements"
n=$(grep -c '^[A-Za-z0-9]' "$reqs" || true)
echo "venv: installing the $n packages of $reqs into $dir (pip, from PyPI; output in $log)"
rc=0
"$dir/bin/python" -m pip install --no-deps --no-input --disable-pip-version-check -r "$reqs" >>"$log" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "pip install failed (exit $rc)"
cp "$reqs" "$dir/.requirements"
echo "venv: $dir is ready ($(du -sh "$dir" 2>/dev/null | cut -f1))"
