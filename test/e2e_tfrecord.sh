#!/bin/sh
# e2e_tfrecord.sh: Fashion-MNIST as TFRecord files of tf.Example records (written by
# test/make_tfrecord.py, framing and protobuf by hand, issue 19) through the command line: training
# from them gives the same train and eval loss, bit for bit, as training from the IDX files (raw-byte
# and PNG-encoded images, with and without index files); bench-data reads every record; `ctrain
# info` describes a file, and a TensorBoard event file (the same framing); GZIP- and
# ZLIB-compressed files train the same; `ctrain pack --from
# tfrecord` gives shards that train to the same losses, and takes --features INPUT,LABEL;
# a bad data CRC, a truncated file and a missing feature exit 3 naming the file, the record and the
# feature, and data.skip_corrupt skips and counts the corrupt record.
# Usage: sh test/e2e_tfrecord.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
need_fmnist
scratch_dir
[ -x /usr/bin/python3 ] || missing_dep "/usr/bin/python3 (Debian's python3)"

N_TRAIN=6000 N_EVAL=1000
mkdir "$T/data"
gen() { /usr/bin/python3 test/make_tfrecord.py --idx "$D/$1-images-idx3-ubyte.gz" "$D/$1-labels-idx1-ubyte.gz" "$T/data/$2" "$3" "$4" --count "$5" --index ||
            { bad "make_tfrecord.py $*"; exit 1; }; }
gen train "train-%d.tfrecord" 3 raw $N_TRAIN
gen t10k "eval-%d.tfrecord" 1 png $N_EVAL

vs_idx_entries
TFR_TRAIN='{"format": "tfrecord", "path": "data/train-{0..2}.tfrecord", "input": "image", "label": "label", "shape": [1, 28, 28]}'
TFR_EVAL='{"format": "tfrecord", "path": "data/eval-0.tfrecord"}'
TFR_TRAIN_INDEXED='{"format": "tfrecord", "path": "data/train-{0..2}.tfrecord", "index": "data/train-{0..2}.index", "shape": [1, 28, 28]}'
vs_idx_config idx "$IDX_TRAIN" "$IDX_EVAL"
vs_idx_config tfr "$TFR_TRAIN" "$TFR_EVAL"
vs_idx_config tfri "$TFR_TRAIN_INDEXED" "$TFR_EVAL"

vs_idx_train idx
vs_idx_train tfr
same_loss_as_idx tfr "raw-byte train records (3 files, a brace pattern), PNG eval records"
vs_idx_train tfri
same_loss_as_idx tfri "with tfrecord2idx index files"

# Compressed files (TFRecordOptions "GZIP": gzip, "ZLIB": a zlib stream), inflated at open: the same
# losses; a stream cut short exits 3 naming the file.
for k in 0 1 2; do
    /usr/bin/python3 -c 'import gzip, sys; open(sys.argv[2], "wb").write(gzip.compress(open(sys.argv[1], "rb").read()))' \
        "$T/data/train-$k.tfrecord" "$T/data/train-$k.tfrecord.gz" || bad "gzip-compressing train-$k"
done
/usr/bin/python3 -c 'import sys, zlib; open(sys.argv[2], "wb").write(zlib.compress(open(sys.argv[1], "rb").read()))' \
    "$T/data/eval-0.tfrecord" "$T/data/eval-0.tfrecord.z" || bad "zlib-compressing the eval file"
vs_idx_config tfrz '{"format": "tfrecord", "path": "data/train-{0..2}.tfrecord.gz", "shape": [1, 28, 28]}' \
    '{"format": "tfrecord", "path": "data/eval-0.tfrecord.z"}'
vs_idx_train tfrz
same_loss_as_idx tfrz "GZIP-compressed train files, a ZLIB-compressed eval file"
"$B" info "$T/data/train-1.tfrecord.gz" >"$T/info" 2>"$T/err" || bad "info on a gzip file: $(cat "$T/err")"
has "$T/info" "compressed (gzip or zlib): 1676000 bytes inflated" "info inflates a compressed file"
has "$T/info" "records: 2000," "and counts its records"
head -c 300000 "$T/data/train-2.tfrecord.gz" >"$T/data/cut.tfrecord.gz"
sed 's/train-{0..2}.tfrecord.gz/cut.tfrecord.gz/; s/run-tfrz/run-cutz/' "$T/tfrz.json" >"$T/cutz.json"
"$B" --quiet --config "$T/cutz.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a compressed file cut short exits 3" || bad "cut gzip: exit $rc"
has "$T/err" "cut.tfrecord.gz: compressed (gzip or zlib) and cut short: the stream ends at compressed byte 300000" \
    "naming the file and the byte"

# data.shuffle_buffer (WebDataset's shuffle over shuffled shards): the same losses with 1 or 2
# workers, other losses than the full permutation, and a run stopped at step 20 and resumed ends
# with the weights of the run that was not stopped.
sed 's/"shuffle": true,/"shuffle": true, "shuffle_buffer": 500,/' "$T/tfr.json" >"$T/buf.json"
cp "$T/buf.json" "$T/buf1.json"
vs_idx_train buf --set train.run_dir="$T/run-buf"
vs_idx_train buf1 --set train.run_dir="$T/run-buf1" --set data.workers=1
[ -n "$(summary_loss "$T/buf.s.json")" ] && [ "$(summary_loss "$T/buf.s.json")" = "$(summary_loss "$T/buf1.s.json")" ] &&
    [ "$(summary_loss "$T/buf.s.json")" != "$(summary_loss "$T/tfr.s.json")" ] &&
    ok "data.shuffle_buffer: the same losses with 1 and 2 workers, not the permutation's ($(summary_loss "$T/buf.s.json"))" ||
    bad "data.shuffle_buffer: 2 workers $(summary_loss "$T/buf.s.json"), 1 worker $(summary_loss "$T/buf1.s.json"), permutation $(summary_loss "$T/tfr.s.json")"
"$B" --quiet --config "$T/buf.json" --set train.run_dir="$T/run-bufr" --set train.max_steps=20 >/dev/null 2>"$T/err" &&
    "$B" --quiet --config "$T/buf.json" --set train.run_dir="$T/run-bufr" --resume auto >/dev/null 2>"$T/err" ||
    bad "shuffle_buffer stop and resume: $(cat "$T/err")"
cmp -s "$T/run-buf/checkpoints/global_step40/model.safetensors" "$T/run-bufr/checkpoints/global_step40/model.safetensors" &&
    ok "data.shuffle_buffer: stopped at step 20 and resumed, the same weights at step 40" ||
    bad "data.shuffle_buffer: the resumed run's weights differ ($(ls "$T/run-bufr/checkpoints" "$T/run-buf/checkpoints" | tr '\n' ' '))"

"$B" bench-data --config "$T/tfr.json" >"$T/bt" 2>"$T/err" || bad "bench-data: $(cat "$T/err")"
has "$T/bt" '"format": "tfrecord"' "bench-data reads the format"
has "$T/bt" '"samples": 5888' "bench-data reads one epoch: 46 full batches of 128 of the $N_TRAIN records"
"$B" info "$T/data/eval-0.tfrecord" >"$T/info" 2>"$T/err" || bad "info: $(cat "$T/err")"
has "$T/info" "records: $N_EVAL," "info counts a file's records"
has "$T/info" "image: bytes_list of 1 (.*PNG)" "info shows the first record's features"

# A TensorBoard event file is TFRecord too (the same framing code writes it): info reads its records
# and says its first one is no tf.Example.
"$B" --quiet --config "$T/tfr.json" --set train.max_steps=2 --set train.run_dir="$T/run-tb" \
    --set 'tensorboard={"enabled": true}' >/dev/null 2>"$T/err" || bad "train with tensorboard: $(cat "$T/err")"
ev=$(find "$T/run-tb" -name 'events.out.tfevents.*' | head -n 1)
if [ -n "$ev" ] && "$B" info "$ev" >"$T/info" 2>"$T/err"; then
    has "$T/info" "records: [1-9]" "info reads a TensorBoard event file's records"
    has "$T/info" "not a tf.Example" "and says they are not tf.Examples"
else
    bad "info on the event file '$ev': $(cat "$T/err")"
fi

# pack --from tfrecord: ctrain shards of the same records in the same order train to the same losses.
if "$B" pack --from tfrecord "$T/data/train-{0..2}.tfrecord" --out "$T/packed" >"$T/pk" 2>"$T/err"; then
    has "$T/pk" "packed $N_TRAIN records of \[u8 784 values\]" "pack --from tfrecord packs every record as bytes"
    vs_idx_config packed '{"format": "shard", "path": "packed"}' "$TFR_EVAL"
    sed -i 's/"model": {"input": \[1, 28, 28\]/"model": {"input": [784]/' "$T/packed.json" # raw bytes without a shape: [784]
    vs_idx_train packed
    same_loss_as_idx packed "the packed shards"
else
    bad "pack --from tfrecord: $(cat "$T/err")"
fi
"$B" pack --from tfrecord "$T/data/eval-0.tfrecord" --features image,label --out "$T/packed-eval" >"$T/pk" 2>"$T/err" &&
    has "$T/pk" "packed $N_EVAL records of \[u8 784 values\]" "pack --features names the input and label features (PNG records)" ||
    bad "pack --features: $(cat "$T/err")"
"$B" pack --from tfrecord "$T/data/eval-0.tfrecord" --features image --out "$T/packed-bad" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && grep -q "expected INPUT,LABEL" "$T/err" && ok "pack --features without a label exits 2" ||
    bad "pack --features image: exit $rc, $(cat "$T/err")"

# A flipped byte inside record 7 of train-1 (its data starts 12 bytes after its header): exit 3
# naming the file and record, or skipped and counted with data.skip_corrupt.
off=$((7 * 838 + 12 + 100))
printf '\377' | dd of="$T/data/train-1.tfrecord" bs=1 seek=$off conv=notrunc 2>/dev/null
"$B" --quiet --config "$T/tfr.json" --set train.max_steps=100 --set train.run_dir="$T/run-crc" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a bad data CRC exits 3" || bad "bad data CRC: exit $rc"
has "$T/err" "train-1.tfrecord: record 7 (offset 5866): bad data CRC" "the file and record are named"
"$B" info "$T/data/train-1.tfrecord" >"$T/info" 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "info on it exits 3" || bad "info on a bad data CRC: exit $rc"
has "$T/info" "records: 2000, .* 1 with a bad data CRC" "info counts it"
has "$T/err" "train-1.tfrecord: record 7 (offset 5866): bad data CRC" "and names it"
"$B" --quiet --config "$T/tfr.json" --set train.max_steps=100 --set data.skip_corrupt=true --set train.run_dir="$T/run-skip" --summary "$T/sk.json" >/dev/null 2>"$T/err" ||
    bad "skip_corrupt: $(cat "$T/err")"
has "$T/sk.json" '"skipped_records":1' "data.skip_corrupt skips and counts it"
# A missing feature: exit 3 naming it and the features the record has.
sed 's/"label": "label"/"label": "class"/; s/run-tfr/run-miss/' "$T/tfr.json" >"$T/miss.json"
"$B" --quiet --config "$T/miss.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a missing feature exits 3" || bad "missing feature: exit $rc"
has "$T/err" 'train-0.tfrecord: record 0 (offset 0): feature "class" (label) is missing; the record has: image, label' \
    "the file, record and feature are named"
# A file cut inside its last record: exit 3 at open.
head -c 1675990 "$T/data/train-2.tfrecord" >"$T/cut" && mv "$T/cut" "$T/data/train-2.tfrecord"
"$B" --quiet --config "$T/tfr.json" --set train.run_dir="$T/run-cut" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a truncated file exits 3" || bad "truncated file: exit $rc"
has "$T/err" "train-2.tfrecord: record 1999 at offset 1675162: truncated" "the file and record are named"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
