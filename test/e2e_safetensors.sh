#!/bin/sh
# safetensors files written by ctrain, read back by an independent reader: test/ref/write_st_sample.c
# (built here against BUILD/libctrain.a) writes a sample file with every dtype ctrain writes, a
# checkpoint (ct_ckpt_save) and two exports (`ctrain export` as a function: bf16 and fp16), plus
# the values they must hold; test/ref/read_safetensors.py (stdlib + numpy, and torch.frombuffer
# when Debian's python3-torch is present) checks them bit for bit.
# Usage: e2e_safetensors.sh BUILD_DIR. Fails, naming it, when /usr/bin/python3 or numpy is missing.
set -u
BUILD=${1:-build}
PY=/usr/bin/python3
[ -x "$PY" ] || { echo "FAIL missing dependency: /usr/bin/python3 (Debian's python3); make deps installs it"; exit 1; }
"$PY" -c "import numpy" 2>/dev/null || { echo "FAIL missing dependency: numpy for /usr/bin/python3 (Debian's python3-numpy); make deps installs it"; exit 1; }
[ -f "$BUILD/libctrain.a" ] || { echo "FAIL: $BUILD/libctrain.a missing (run make)"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CFLAGS_ST="-std=c11 -D_GNU_SOURCE -O1 -I. $(pkg-config --cflags libcjson 2>/dev/null)"
LIBS_ST="$(pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lpng -ljpeg -lz -lm -ldl -pthread"
# shellcheck disable=SC2086
${CC:-cc} $CFLAGS_ST test/ref/write_st_sample.c "$BUILD/libctrain.a" -o "$T/write_st_sample" $LIBS_ST \
    || { echo "FAIL: cannot build test/ref/write_st_sample.c"; exit 1; }
"$T/write_st_sample" "$T" || { echo "FAIL: write_st_sample"; exit 1; }
"$PY" test/ref/read_safetensors.py --check "$T" "$T/expected.json" || exit 1
# the reader must notice damage too (otherwise the check above proves nothing)
head -c 100 "$T/sample.safetensors" > "$T/cut.safetensors"
if "$PY" test/ref/read_safetensors.py "$T/cut.safetensors" >/dev/null; then
    echo "FAIL: the reference reader accepted a truncated file"; exit 1
fi
# and ctrain's reader agrees with it on the same files when ctrain is built
if [ -x "$BUILD/ctrain" ] && "$BUILD/ctrain" info "$T/sample.safetensors" >"$T/info" 2>&1; then
    grep -q "layer.weight" "$T/info" || { echo "FAIL: ctrain info output"; cat "$T/info"; exit 1; }
fi
echo "ok   safetensors written by ctrain read back equal"
