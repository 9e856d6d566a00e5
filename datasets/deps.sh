#!/bin/sh
# Install the Debian packages ctrain needs to build and test: `make deps`, and `make run`,
# `make test` and `make test-cuda` through `make check-deps` when a package is missing.
#
# Usage: deps.sh [--check] [--log FILE] PKG...
#   --check     install nothing: exit 1, naming them, when packages are missing
#   --log FILE  where apt-get's output goes (default: a new temporary file); the terminal gets one
#               line per step, and on a failure the file's path and its last 20 lines
# Runs apt-get as root, or through sudo (saying so) for another user. Exit status: 0 when every
# package is installed, 1 when packages are missing (--check) or apt-get failed, 2 when it cannot
# install: not root and no sudo (it prints the command to run as root), or not a Debian system.
set -eu
check_only=0
log=""
while [ $# -gt 0 ]; do
    case $1 in
    --check) check_only=1; shift ;;
    --log) [ $# -ge 2 ] || { echo "deps: --log needs a file" >&2; exit 2; }; log=$2; shift 2 ;;
    --) shift; break ;;
    -*) echo "deps: unknown option $1 (usage: deps.sh [--check] [--log FILE] PKG...)" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "deps: no packages named (usage: deps.sh [--check] [--log FILE] PKG...)" >&2; exit 2; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: dpkg-query or apt-get not found: this is not a Debian system; install the equivalents" >&2
    echo "deps: of these Debian packages with its package manager, then run this again: $*" >&2
    exit 2
fi

# missing PKG...: the packages of PKG... that are not installed (held ones are), space-separated
missing() {
    installed=" $(dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null | sed -n 's/ [a-z]* ok installed$//p' | tr '\n' ' ')"
    for p in "$@"; do
        case $installed in *" $p "*) ;; *) printf '%s ' "$p" ;; esac
    done
}
need=$(missing "$@")
need=${need% }
if [ -z "$need" ]; then
    [ $check_only -eq 1 ] || echo "deps: all $# packages installed"
    exit 0
fi
# shellcheck disable=SC2086
n=$(set -- $need; if [ $# -eq 1 ]; then echo "1 package"; else echo "$# packages"; fi)
if [ $check_only -eq 1 ]; then
    echo "deps: $n missing: $need"
    exit 1
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
    echo "deps: not root: running apt-get through sudo (it may ask for your password)"
else
    echo "deps: $n to install ($need), which needs root, and sudo is not installed." >&2
    echo "deps: as root, run:" >&2
    echo "    apt-get update && apt-get install -y --no-install-recommends $need" >&2
    echo "deps: then run this again." >&2
    exit 2
fi

# the log: FILE, or a new temporary file when none is given or FILE cannot be written (another
# user's build/, say)
if [ -z "$log" ] || ! { mkdir -p "$(dirname "$log")" && : >"$log"; } 2>/dev/null; then
    log=$(mktemp "${TMPDIR:-/tmp}/ctrain-deps.XXXXXX")
fi
# fail MESSAGE: say what failed, where apt-get's whole output is, and how it ends
fail() {
    echo "deps: $1; apt-get's output is in $log, which ends with:" >&2
    tail -n 20 "$log" | sed 's/^/    /' >&2
    exit 1
}

# On a fresh machine the package lists are empty: update them first. A failure (one unreachable
# mirror, say) need not stop the install: the lists there are may hold every package.
echo "deps: updating the package lists (apt-get update; output in $log)"
rc=0
$sudo apt-get update >>"$log" 2>&1 || rc=$?
[ $rc -eq 0 ] || echo "deps: apt-get update failed (exit $rc); trying the install with the lists there are"

echo "deps: installing $n: $need"
rc=0
# shellcheck disable=SC2086
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need >>"$log" 2>&1 || rc=$?
[ $rc -eq 0 ] || fail "apt-get install failed (exit $rc)"
# shellcheck disable=SC2086
still=$(missing $need)
[ -z "$still" ] || fail "apt-get install ended but these are still not installed: ${still% }"
echo "deps: installed $n"
