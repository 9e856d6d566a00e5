#!/bin/sh
# bundle.sh BUILD OUT: copy build/ctrain, the test binaries, the test scripts and data, configs and
# the shared libraries they need that are not part of glibc, the CUDA driver or the CUDA toolkit
# into OUT, so `make test-cuda`-style runs work on a GPU machine that has only the driver and the
# toolkit. The binaries carry the rpath $ORIGIN/lib and $ORIGIN/../lib (see the Makefile).
# Run there as:  cd OUT && sh test/run_tests.sh . cuda
# BUNDLE_ONEDNN=1 also copies oneDNN (libdnnl.so.2, 40 MB, about 7 MB xz-compressed, and
# libOpenCL.so.1 it links), which the CPU backend loads with dlopen: for gpu_check.sh's cpubf16
# phase, the host CPU's native bf16. Left out otherwise: the GPU runs do not need it.
set -eu
BUILD=$1
OUT=$2
rm -rf "$OUT"
mkdir -p "$OUT/lib" "$OUT/test" "$OUT/bench"
cp "$BUILD/ctrain" "$OUT/"
# The CUDA backend, which ctrain dlopens from lib/ beside itself.
if [ -f "$BUILD/libctrain_cuda.so" ]; then cp "$BUILD/libctrain_cuda.so" "$OUT/lib/"; fi
# The MPI communicator, which ctrain dlopens from lib/ under mpirun; not OpenMPI itself: mpirun, its
# daemons and components come from the machine (libmpi.so.40, Debian's openmpi-bin), and a bundled
# libmpi would shadow the machine's (the rpath) and mismatch its mpirun, so the library list below
# leaves libctrain_mpi.so's needs out.
if [ -f "$BUILD/libctrain_mpi.so" ]; then cp "$BUILD/libctrain_mpi.so" "$OUT/lib/"; fi
for t in "$BUILD"/test/test_*; do [ -x "$t" ] && cp "$t" "$OUT/test/"; done
cp "$BUILD"/test/libfake_*.so "$OUT/test/" 2>/dev/null || true   # test_backend's stand-in libraries
cp test/*.sh "$OUT/test/"
# the data scripts the end-to-end runs call (licence_tokens: datasets/text_tokens.sh)
mkdir -p "$OUT/datasets" && cp datasets/*.sh "$OUT/datasets/"
cp -r test/ref test/conformance configs docs "$OUT/" 2>/dev/null || true
mv "$OUT/ref" "$OUT/test/ref"; mv "$OUT/conformance" "$OUT/test/conformance"
cp bench/* "$OUT/bench/" 2>/dev/null || true
# Debug info is not needed there and would push the bundle past what a device run can carry.
strip --strip-debug "$OUT/ctrain" "$OUT"/test/test_* "$OUT"/lib/*.so 2>/dev/null || true
# Libraries: everything ldd resolves, minus glibc, the CUDA driver and the CUDA toolkit; and
# OpenBLAS, which the CPU backend loads with dlopen (ldd does not see it), with what it needs.
BLAS=$(ldconfig -p | awk '$1 == "libopenblas.so.0" && $NF ~ /^\// {print $NF; exit}')
DNNL=""
if [ "${BUNDLE_ONEDNN:-0}" = 1 ]; then
    DNNL=$(ldconfig -p | awk '$1 == "libdnnl.so.2" && $NF ~ /^\// {print $NF; exit}')
    [ -n "$DNNL" ] || { echo "bundle: BUNDLE_ONEDNN=1 but libdnnl.so.2 not found (apt-get install libdnnl2)" >&2; exit 1; }
fi
[ -n "$BLAS" ] || { echo "bundle: libopenblas.so.0 not found (make deps)" >&2; exit 1; }
{ echo "	libopenblas.so.0 => $BLAS (0)"
  [ -z "$DNNL" ] || echo "	libdnnl.so.2 => $DNNL (0)"
  for bin in "$OUT/ctrain" "$OUT"/test/test_* "$OUT"/lib/libctrain_cuda.so "$BLAS" $DNNL; do [ -f "$bin" ] && ldd "$bin"; done
} | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    sort -u | while read -r lib; do
        case "$(basename "$lib")" in
        libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libresolv.so*) continue ;;
        # the compiler's runtime: every image has one, and Debian 12's older copy would shadow a
        # newer one (PyTorch's) wherever bundle/lib is on LD_LIBRARY_PATH
        libstdc++.so*|libgcc_s.so*|libgomp.so*) continue ;;
        esac
        case "$lib" in /usr/local/cuda*|*/libctrain_cuda.so) continue ;; esac
        cp -L "$lib" "$OUT/lib/"
    done
# `make gpu-check` inside the bundle, where Debian's build tree is absent
printf 'gpu-check:\n\t@sh test/gpu_check.sh .\n' > "$OUT/Makefile"
echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1)); libraries: $(ls "$OUT/lib" | tr '\n' ' ')"
