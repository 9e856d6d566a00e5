#!/bin/sh
# run_fuzz.sh TARGET SECONDS: build test/fuzz/TARGET.c as a libFuzzer binary (clang, with
# AddressSanitizer and UndefinedBehaviorSanitizer) and fuzz it for SECONDS on one core.
# Independent of the Makefile: it compiles the core sources the target needs directly.
#   FUZZ_SRCS   core sources to compile (default: per target, below)
#   FUZZ_FLAGS  extra libFuzzer flags, e.g. "-jobs=2 -workers=2"
# Seed corpus (data targets: test/fuzz/seeds-TARGET/): the DeepSpeed configs in test/conformance/ds_configs plus configs/*.json,
# copied into test/fuzz/corpus-TARGET/ (kept between runs, so later runs start where this ended).
# Crashes are written as test/fuzz/crash-<sha1>; reproduce one with: build/fuzz/TARGET FILE
set -eu
if [ $# -ne 2 ]; then
    echo "usage: $0 TARGET SECONDS   (e.g. $0 fuzz_json 600)" >&2
    exit 2
fi
target=$1
seconds=$2
cd "$(dirname "$0")/../.."
src=test/fuzz/$target.c
[ -f "$src" ] || { echo "run_fuzz.sh: no $src" >&2; exit 2; }

case $target in
fuzz_json) default_srcs="core/util/common.c core/util/json.c" ;;
fuzz_safetensors) default_srcs="core/util/common.c core/util/tensor.c core/ckpt/safetensors.c" ;;
fuzz_png) default_srcs="core/util/common.c core/data/png.c" ;;
# fuzz_config: the config reader checks data entries against core/data's format rows.
fuzz_idx | fuzz_shard | fuzz_tokens | fuzz_webdataset | fuzz_tfrecord | fuzz_hdf5 | fuzz_config) default_srcs="core/util/common.c core/util/json.c core/util/tensor.c core/util/fs.c core/util/crc32c.c core/util/tfrecord.c core/util/rng.c
    $(ls core/config/*.c | tr '\n' ' ') core/optim/sched.c $(ls core/data/*.c | grep -v loader.c | tr '\n' ' ')" ;;
*) default_srcs=$(find core -name '*.c') ;;
esac
srcs=${FUZZ_SRCS:-$default_srcs}
# fuzz_hdf5 runs libhdf5 (Debian's, not instrumented) only in the metadata probe, a separate
# executable built here without sanitizers (test/fuzz/hdf5_probe.c) and spawned per open: a crash
# there is the reader's exit 3, not a finding; everything ctrain decodes itself runs under ASan.
target_flags=""
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null 2>&1 || { echo "run_fuzz.sh: clang not found (apt-get install clang)" >&2; exit 2; }
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -I. $(pkg-config --cflags libcjson 2>/dev/null || true)"
libs="$(pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lpng -ljpeg -lz -lm -ldl -pthread"
mkdir -p build/fuzz
bin=build/fuzz/$target
echo "run_fuzz.sh: building $bin from $src $srcs"
# shellcheck disable=SC2086
if ! "$CLANG" $cflags -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
        "$src" $srcs -o "$bin" $libs; then
    echo "run_fuzz.sh: build failed; if -fsanitize=fuzzer does not link, install the runtime:" >&2
    echo "  apt-get install libclang-rt-14-dev   (or: apt-get install llvm clang)" >&2
    exit 1
fi

if [ "$target" = fuzz_hdf5 ]; then
    probe_srcs="test/fuzz/hdf5_probe.c core/data/hdf5_probe.c core/data/hdf5_layout.c core/data/hdf5_lib.c core/util/common.c core/util/fs.c"
    echo "run_fuzz.sh: building build/fuzz/hdf5_probe (no sanitizers) from $probe_srcs"
    # shellcheck disable=SC2086
    "$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -I. $probe_srcs -o build/fuzz/hdf5_probe -ldl -pthread ||
        { echo "run_fuzz.sh: the HDF5 probe did not build" >&2; exit 1; }
    export CTRAIN_HDF5_PROBE="$PWD/build/fuzz/hdf5_probe"
fi

corpus=test/fuzz/corpus-$target
mkdir -p "$corpus"
case $target in
fuzz_json) seeds="test/conformance/ds_configs/*.json configs/*.json" ;;
*) seeds="test/fuzz/seeds-$target/*" ;; # small valid files (see the fuzz_*.c headers)
esac
for f in $seeds; do
    [ -f "$f" ] && cp -f "$f" "$corpus/seed-$(basename "$f")"
done
echo "run_fuzz.sh: fuzzing $target for $seconds s (corpus $corpus, $(ls "$corpus" | wc -l) files)"
# shellcheck disable=SC2086
exec nice -n 10 "./$bin" "$corpus" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix=test/fuzz/ -max_len=8192 $target_flags ${FUZZ_FLAGS:-}
