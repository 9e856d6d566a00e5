#!/bin/sh
# e2e_hdf5.sh: Fashion-MNIST as HDF5 files written by h5py (test/make_hdf5.py, issue 19) through the
# command line: training from a contiguous, a chunked and a gzip-compressed file gives the same
# train and eval loss, bit for bit, as training from the IDX files with the same order settings;
# bench-data reads every sample; `ctrain info` lists the datasets; `ctrain pack --from hdf5` gives
# shards that train to the same losses; a truncated file, a missing dataset and a missing libhdf5
# exit 3, 3 and 1 naming the file, the dataset and the package; an unknown entry key exits 2.
# Fails, naming it, without h5py or the Fashion-MNIST package (make deps installs both).
# Usage: sh test/e2e_hdf5.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
need_fmnist
scratch_dir
[ -x /usr/bin/python3 ] || missing_dep "/usr/bin/python3 (Debian's python3)"

N_TRAIN=6000 N_EVAL=1000
gen() { # SET OUT LAYOUT COUNT
    /usr/bin/python3 test/make_hdf5.py --idx "$D/$1-images-idx3-ubyte.gz" "$D/$1-labels-idx1-ubyte.gz" "$T/$2" "$3" \
        --count "$4" >"$T/gen" 2>&1
    rc=$?
    [ $rc -eq 77 ] && missing_dep "h5py for /usr/bin/python3 (Debian's python3-h5py): $(cat "$T/gen")"
    [ $rc -eq 0 ] || { bad "make_hdf5.py $*: $(cat "$T/gen")"; exit 1; }
}
gen train train.h5 contiguous $N_TRAIN
gen train train-chunked.h5 chunked $N_TRAIN
gen train train-gzip.h5 gzip $N_TRAIN
gen t10k eval.h5 contiguous $N_EVAL

vs_idx_entries
H5_EVAL='{"format": "hdf5", "path": "eval.h5"}'
vs_idx_config idx "$IDX_TRAIN" "$IDX_EVAL"
vs_idx_config h5 '{"format": "hdf5", "path": "train.h5", "images": "images", "labels": "labels"}' "$H5_EVAL"
vs_idx_config h5c '{"format": "hdf5", "path": "train-chunked.h5"}' "$H5_EVAL"
vs_idx_config h5z '{"format": "hdf5", "path": "train-gzip.h5"}' "$H5_EVAL"

vs_idx_train idx
vs_idx_train h5
same_loss_as_idx h5 "contiguous HDF5 datasets (read with pread)"
vs_idx_train h5c
same_loss_as_idx h5c "chunked HDF5 datasets (chunks located by the probe, read by ctrain)"
vs_idx_train h5z
same_loss_as_idx h5z "gzip + shuffle chunked HDF5 datasets (inflated and un-shuffled by ctrain)"

"$B" bench-data --config "$T/h5z.json" >"$T/bt" 2>"$T/err" || bad "bench-data: $(cat "$T/err")"
has "$T/bt" '"format": "hdf5"' "bench-data reads the format"
has "$T/bt" '"samples": 5888' "bench-data reads one epoch: 46 full batches of 128 of the $N_TRAIN samples"
"$B" info "$T/train-gzip.h5" >"$T/info" 2>"$T/err" || bad "info: $(cat "$T/err")"
has "$T/info" "images: uint8 \[6000, 28, 28\], chunked \[64, 28, 28\], filters: shuffle, deflate" "info lists a dataset's type, shape, chunks and filters"
has "$T/info" "labels: int64 \[6000\], contiguous" "and the labels"

# pack --from hdf5: ctrain shards of the same samples in the same order train to the same losses.
if "$B" pack --from hdf5 "$T/train-gzip.h5" --out "$T/packed" >"$T/pk" 2>"$T/err"; then
    has "$T/pk" "packed $N_TRAIN records of \[u8 784 values\]" "pack --from hdf5 packs uint8 images as bytes"
    vs_idx_config packed '{"format": "shard", "path": "packed"}' "$H5_EVAL"
    vs_idx_train packed
    same_loss_as_idx packed "the packed shards"
else
    bad "pack --from hdf5: $(cat "$T/err")"
fi
"$B" pack --from hdf5 "$T/eval.h5" --features images,labels --out "$T/packed-eval" >"$T/pk" 2>"$T/err" &&
    has "$T/pk" "packed $N_EVAL records" "pack --features names the datasets" ||
    bad "pack --features: $(cat "$T/err")"

# Bad input: exit 3 naming the file and the dataset; a missing libhdf5 exits 1 naming the package.
sed 's/"path": "train.h5", "images": "images"/"path": "train.h5", "images": "pixels"/; s/run-h5"/run-miss"/' "$T/h5.json" >"$T/miss.json"
"$B" --quiet --config "$T/miss.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a missing dataset exits 3" || bad "missing dataset: exit $rc"
has "$T/err" "train.h5: no dataset \"pixels\" (images) in the file; its root group has: images, labels" \
    "the file and dataset are named, with the datasets it has"
head -c 3000000 "$T/train.h5" >"$T/cut.h5"
sed 's/"path": "train.h5"/"path": "cut.h5"/; s/run-h5"/run-cut"/' "$T/h5.json" >"$T/cut.json"
"$B" --quiet --config "$T/cut.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a truncated file exits 3" || bad "truncated file: exit $rc"
has "$T/err" "cut.h5: truncated: the HDF5 superblock says the file ends at byte" "the file is named"
CTRAIN_HDF5_LIB=/nonexistent/libhdf5.so "$B" --quiet --config "$T/h5.json" --set train.run_dir="$T/run-nolib" \
    >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 1 ] && ok "a missing libhdf5 exits 1" || bad "missing libhdf5: exit $rc"
has "$T/err" "apt-get install libhdf5-103-1" "the package to install is named"
sed 's/"path": "train.h5", "images": "images"/"path": "train.h5", "image": "images"/' "$T/h5.json" >"$T/key.json"
"$B" --quiet --config "$T/key.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok "an unknown entry key exits 2" || bad "unknown key: exit $rc"
has "$T/err" "data.train.image: unknown key; did you mean data.train.images?" "and suggests the key"

# What fuzz_hdf5 found: a symbol table node whose size makes libhdf5 ask malloc for 10^18 bytes
# (malloc says no, libhdf5 says so): exit 3 naming the file, no crash.
"$B" info test/fuzz/regress/hdf5-huge-metadata-alloc.h5 >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a fuzzed file with a huge metadata size exits 3" || bad "huge metadata size: exit $rc"
has "$T/err" "hdf5-huge-metadata-alloc.h5: libhdf5 cannot read it: " "with libhdf5's reason"

# And chunks [2, 255, 4] on a fixed [6, 4, 4] dataset (a mutated layout message), on which libhdf5
# 1.10 reads freed memory: refused before any read, exit 3 naming the file and the dataset.
cat >"$T/fz.json" <<JSON
{"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
 "data": {"train": {"format": "hdf5", "path": "$PWD/test/fuzz/regress/hdf5-chunk-larger-than-shape.h5"}}}
JSON
"$B" bench-data --config "$T/fz.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "chunks larger than a fixed shape exit 3" || bad "chunks larger than the shape: exit $rc"
has "$T/err" 'dataset "images" (images): chunks \[2, 255, 4\] do not fit its fixed shape' "naming the dataset and its chunks"

# A chunk address past the end of the file (a fuzzed file), with the loader's worker threads: the
# probe's chunk index is checked at open, so exit 3 naming the dataset and the chunk before any
# read, and none of libhdf5's own "HDF5-DIAG" reports on stderr (libhdf5 runs only in the probe,
# with its error printing off).
sed 's#hdf5-chunk-larger-than-shape.h5"}}#hdf5-chunk-past-end.h5"}, "workers": 2}#' "$T/fz.json" >"$T/fz2.json"
"$B" bench-data --config "$T/fz2.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a chunk past the end of the file exits 3" || bad "chunk past the end: exit $rc"
has "$T/err" 'dataset "images": chunk 1 (16318523 bytes at byte 4595) runs past the end of the file (6856 bytes' \
    "naming the dataset and the chunk"
grep -q "HDF5-DIAG" "$T/err" && bad "libhdf5 printed its own error report: $(head -c 300 "$T/err")" ||
    ok "libhdf5 prints nothing of its own"

# A file on which libhdf5 1.10 itself crashes (SIGSEGV in H5Gget_info, found by fuzz_hdf5): libhdf5
# runs only in a child process (the metadata probe), so ctrain and its info exit 3 saying so.
for cmd in info bench; do
    if [ $cmd = info ]; then "$B" info test/fuzz/regress/hdf5-libhdf5-segv-group-info.h5 >/dev/null 2>"$T/err"
    else sed 's#hdf5-chunk-larger-than-shape.h5#hdf5-libhdf5-segv-group-info.h5#' "$T/fz.json" >"$T/fz3.json"
         "$B" bench-data --config "$T/fz3.json" >/dev/null 2>"$T/err"; fi
    rc=$?
    [ $rc -eq 3 ] && ok "$cmd: a file that crashes libhdf5 exits 3" || bad "$cmd: a file that crashes libhdf5: exit $rc"
    has "$T/err" "hdf5-libhdf5-segv-group-info.h5: libhdf5 crashed (signal 11" "$cmd: and says libhdf5 crashed on it"
done

# A 168-byte file on which libhdf5 asks for (and memsets) 4 GB (fuzz_hdf5's slow unit): the probe's
# address space is capped, so it fails fast, exit 3, instead of taking the machine's memory.
start=$(date +%s)
"$B" info test/fuzz/regress/hdf5-libhdf5-4gb-alloc.h5 >/dev/null 2>"$T/err"
rc=$? secs=$(($(date +%s) - start))
[ $rc -eq 3 ] && [ $secs -lt 5 ] && ok "a file on which libhdf5 allocates 4 GB exits 3 in ${secs}s" ||
    bad "libhdf5's 4 GB allocation: exit $rc after ${secs}s: $(head -c 300 "$T/err")"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
