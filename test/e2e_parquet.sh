#!/bin/sh
# e2e_parquet.sh: datasets/parquet_to_shards.py (issue 19: Parquet by conversion): Fashion-MNIST
# rows written as Parquet the way Hugging Face datasets stores images (a struct {"bytes": PNG,
# "path": null} column "image" and an int64 column "label", two files) become ctrain shards that
# train to the IDX run's losses bit for bit; a missing column exits 2 naming the file and the
# columns it has. Runs the python of the tests' virtual environment (.venv/, or $CT_TEST_VENV),
# which has pyarrow (Debian 12 has no package for it; `make deps` installs it there); missing, the
# test fails.
# Usage: sh test/e2e_parquet.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
need_fmnist
scratch_dir
need_venv pyarrow h5py PIL

N=3000
"$PY" - "$D" "$T" $N <<'PY' || { bad "writing the Parquet files"; exit 1; }
import gzip, struct, sys
import pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, "test")
sys.dont_write_bytecode = True
from make_wds import png_gray
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
def idx(path):
    data = gzip.open(path, "rb").read()
    nd = data[3]
    return data[4 + 4 * nd:], struct.unpack(">" + "I" * nd, data[4:4 + 4 * nd])
px, dims = idx(f"{src}/train-images-idx3-ubyte.gz")
lab, _ = idx(f"{src}/train-labels-idx1-ubyte.gz")
per = dims[1] * dims[2]
rows = [{"image": {"bytes": png_gray(28, 28, px[i * per:(i + 1) * per]), "path": None}, "label": lab[i]} for i in range(n)]
for k, part in enumerate((rows[:n // 2], rows[n // 2:])):
    pq.write_table(pa.Table.from_pylist(part), f"{out}/train-{k}.parquet")
PY
"$PY" datasets/parquet_to_shards.py "$T/train-0.parquet" "$T/train-1.parquet" --out "$T/shards" --ctrain "$B" \
    >"$T/pk" 2>"$T/err" || bad "parquet_to_shards.py: $(cat "$T/err")"
has "$T/pk" "packed $N records of \[u8 784 values\]" "the Parquet rows become uint8 shards"

config() { # NAME TRAIN_ENTRY
    cat >"$T/$1.json" <<JSON
{
  "train_batch_size": 100, "train_micro_batch_size_per_gpu": 100,
  "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
  "model": {"input": [1, 28, 28],
            "layers": [{"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc1", "out": 32},
                       {"type": "relu", "name": "relu1"}, {"type": "linear", "name": "fc2", "out": 10}],
            "loss": {"type": "cross_entropy"}},
  "data": {"train": $2, "shuffle": true, "workers": 2},
  "train": {"max_steps": 30, "seed": 3, "device": "cpu", "run_dir": "$T/run-$1"}
}
JSON
}
config idx "{\"format\": \"idx\", \"images\": \"$D/train-images-idx3-ubyte.gz\", \"labels\": \"$D/train-labels-idx1-ubyte.gz\", \"limit\": $N}"
config pq '{"format": "shard", "path": "shards"}'
loss() { sed 's/.*"train_loss":\([^,]*\),.*/\1/' "$1"; }
for n in idx pq; do
    "$B" --quiet --config "$T/$n.json" --summary "$T/$n.s.json" >/dev/null 2>"$T/err" || bad "train $n: $(cat "$T/err")"
done
[ -n "$(loss "$T/idx.s.json")" ] && [ "$(loss "$T/idx.s.json")" = "$(loss "$T/pq.s.json")" ] &&
    ok "shards from Parquet train to the IDX run's loss, bit for bit ($(loss "$T/pq.s.json"))" ||
    bad "losses differ: idx $(loss "$T/idx.s.json"), parquet $(loss "$T/pq.s.json")"

"$PY" datasets/parquet_to_shards.py "$T/train-0.parquet" --label class --out "$T/bad" --ctrain "$B" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok "a missing column exits 2" || bad "missing column: exit $rc"
has "$T/err" "train-0.parquet: no column \"class\"; it has: image, label" "naming the file and its columns"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
