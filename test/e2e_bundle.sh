#!/bin/sh
# The bundle (`make bundle`, test/bundle.sh) starts on a machine that has nothing but glibc and the
# compiler's runtime (libstdc++, libgcc_s), as a GPU image without Debian's libraries: the bundle
# is made into a scratch folder, a root holding only the dynamic loader, glibc's libraries and
# libstdc++/libgcc_s from this host (those ldd names) is built around it, and inside that root
# (chroot, with /proc as every image has) `ctrain --version` runs and a tiny CSV model trains for a few steps on the CPU,
# with OpenBLAS and its libgfortran found in the bundle's lib/ through the binary's RPATH.
# Also: the bundle carries libctrain_mpi.so but not OpenMPI's libraries (the machine's mpirun brings
# them; a bundled libmpi would shadow them), and `mpirun -np 2` of the bundle's ctrain trains with
# it (on this host, outside the root, when mpirun is installed);
# the bundle carries no libstdc++/libgcc_s (they would shadow an image's newer copies), and
# ctrain's search path is a DT_RPATH (which also serves its libraries' own dependencies), not a
# DT_RUNPATH. Usage: e2e_bundle.sh BUILD_DIR. Exit 77 (skipped) when not root or without chroot.
set -u
BUILD=${1:-build}
. test/lib_e2e.sh
[ "$(id -u)" -eq 0 ] || { echo "not root: chroot needs root"; exit 77; }
CHROOT=$(command -v chroot) || { echo "no chroot here"; exit 77; }
scratch_dir
R=$T/root
sh test/bundle.sh "$BUILD" "$R/bundle" >"$T/log" 2>&1 || { cat "$T/log"; exit 1; }
ok "bundle made: $(tail -n 1 "$T/log" | cut -c1-120)"

# The bundle leaves the compiler's runtime to the image.
left=$(ls "$R/bundle/lib" | grep -E '^(libstdc\+\+|libgcc_s|libgomp)\.so' || true)
[ -z "$left" ] && ok "bundle holds no libstdc++/libgcc_s/libgomp" || bad "bundle holds $left"
# The MPI communicator without OpenMPI: the machine's mpirun brings that.
if [ -f "$BUILD/libctrain_mpi.so" ]; then
    [ -f "$R/bundle/lib/libctrain_mpi.so" ] && ok "bundle holds lib/libctrain_mpi.so" || bad "bundle lacks lib/libctrain_mpi.so"
    mpi=$(ls "$R/bundle/lib" | grep -E '^lib(mpi|open-pal|open-rte|pmix|hwloc|event)' || true)
    [ -z "$mpi" ] && ok "bundle holds none of OpenMPI's libraries" || bad "bundle holds $mpi"
fi
# DT_RPATH, not DT_RUNPATH: a RUNPATH would not serve OpenBLAS's own need for libgfortran.
readelf -d "$R/bundle/ctrain" >"$T/dyn"
has "$T/dyn" '(RPATH).*\$ORIGIN/lib' "ctrain carries DT_RPATH \$ORIGIN/lib"
if grep -q '(RUNPATH)' "$T/dyn"; then bad "ctrain carries a DT_RUNPATH"; else ok "ctrain has no DT_RUNPATH"; fi

# The root: the host's copies of the dynamic loader, glibc and the compiler's runtime, at the paths
# ldd shows, for ctrain and every bundled library; everything else must come from the bundle.
for f in "$R/bundle/ctrain" "$R"/bundle/lib/*.so*; do ldd "$f" 2>/dev/null; done |
    awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u >"$T/libs"
n=0
while read -r lib; do
    case "$(basename "$lib")" in
    ld-linux*|libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|libstdc++.so*|libgcc_s.so*) ;;
    *) continue ;;
    esac
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
    n=$((n + 1))
done <"$T/libs"
# The loader's own path as the binaries name it (/lib64/ld-linux-x86-64.so.2 on x86-64).
interp=$(readelf -l "$R/bundle/ctrain" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -n "$interp" ] && [ ! -e "$R$interp" ] && mkdir -p "$R$(dirname "$interp")" && cp -L "$interp" "$R$interp"
# The root holds no libgfortran/OpenBLAS of its own: the bundle's must be the ones used.
outside=$(find "$R" -path "$R/bundle" -prune -o -name '*.so*' -print | grep -vE '/(ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s)[.-]' || true)
[ -z "$outside" ] && ok "root: the loader and $n glibc/compiler runtime libraries, nothing else" || bad "root holds $outside"

# /proc, which the loader reads to expand $ORIGIN (/proc/self/exe). Where this root may not mount
# it (a container without CAP_SYS_ADMIN), LD_ORIGIN_PATH hands the loader the same answer.
mkdir -p "$R/proc"
trap 'umount "$R/proc" 2>/dev/null; rm -rf --one-file-system "$T"' EXIT
if mount -t proc proc "$R/proc" 2>/dev/null; then
    origin=""; ok "/proc mounted in the root"
else
    origin="LD_ORIGIN_PATH=/bundle"; ok "/proc cannot be mounted here: LD_ORIGIN_PATH stands in for it"
fi
# in_root ARGS...: run ARGS in the root with an empty environment (no LD_LIBRARY_PATH)
in_root() { env -i PATH=/bundle $origin "$CHROOT" "$R" "$@"; }

# --version, without LD_LIBRARY_PATH or the host's libraries.
in_root /bundle/ctrain --version >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok "ctrain --version runs in the chroot" || { bad "ctrain --version in the chroot (exit $rc)"; sed 's/^/     /' "$T/err" | head -5; }
has "$T/out" "^ctrain [0-9]" "--version prints the version in the chroot"

# A tiny training run: 16 random features, 4 classes, 8 steps of 32 samples, one thread; the CPU
# backend loads OpenBLAS (dlopen) from the bundle.
mkdir -p "$R/work"
random_csv "$R/work/train.csv" 256 16 4 5
cat >"$R/work/run.json" <<'JSON'
{"train_batch_size": 32,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "model": {"input": [16], "layers": [{"type": "linear", "out": 16}, {"type": "relu"}, {"type": "linear", "out": 4}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}},
 "train": {"max_steps": 8, "seed": 1, "device": "auto", "threads": 1, "run_dir": "/work/run"}}
JSON
in_root /bundle/ctrain --quiet --config /work/run.json --summary /work/s.json >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok "a CSV model trains in the chroot" || { bad "training in the chroot (exit $rc)"; sed 's/^/     /' "$T/err" | head -5; }
has "$R/work/s.json" '"status": *"ok"' "the run's summary says ok"
has "$R/work/s.json" '"steps": *8' "the run made 8 steps"

# The bundle's ctrain under this host's mpirun: 2 ranks at ZeRO stage 2 load the bundle's
# libctrain_mpi.so (lib/ beside the executable).
if [ -f "$R/bundle/lib/libctrain_mpi.so" ] && command -v mpirun >/dev/null 2>&1; then
    sed 's|"/work/run"|"'"$T"'/mpi-run"|; s|"train.csv"|"'"$R"'/work/train.csv"|' "$R/work/run.json" >"$T/mpi.json"
    OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --allow-run-as-root --oversubscribe -np 2 \
        "$R/bundle/ctrain" --config "$T/mpi.json" --set zero_optimization.stage=2 >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -eq 0 ] && ok "mpirun -np 2 of the bundle's ctrain trains (ZeRO stage 2)" ||
        { bad "mpirun -np 2 of the bundle's ctrain (exit $rc)"; sed 's/^/     /' "$T/err" | tail -5; }
    has "$T/err" "2 ranks · ZeRO stage 2" "the bundle's ctrain ran as 2 ranks"
fi
exit $fails
