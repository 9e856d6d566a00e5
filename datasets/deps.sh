#!/bin/sh
# Install the Debian packages ctrain needs to build and test (used by `make deps`).
# Usage: deps.sh [--check] PKG...   --check: exit 1 when any package is missing, install nothing.
set -eu
check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi

missing=""
for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
if [ -z "$missing" ]; then
    [ $check_only -eq 1 ] || echo "deps: all packages present"
    exit 0
fi
if [ $check_only -eq 1 ]; then
    echo "deps: missing:$missing"
    exit 1
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "deps: installing:$missing"
# On a fresh machine the package lists can be empty: update them first.
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
