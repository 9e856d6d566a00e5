#!/bin/sh
# e2e_webdataset.sh: WebDataset .tar shards written by Python's tarfile (test/make_wds.py, issue
# 19) through the command line: a brace pattern relative to the config file trains a model and
# evaluates it, bench-data reads one epoch of every sample, `ctrain info` describes a shard, `ctrain
# pack --from webdataset` gives ctrain shards that train to the same losses, and a
# corrupt shard (a truncated member, a bad header checksum) exits 3 naming the file and member.
# Usage: sh test/e2e_webdataset.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
scratch_dir
[ -x /usr/bin/python3 ] || missing_dep "/usr/bin/python3 (Debian's python3)"

mkdir "$T/data"
/usr/bin/python3 test/make_wds.py "$T/data" png || { bad "make_wds.py"; exit 1; }
# config NAME TRAIN_ENTRY: $T/NAME.json, a tiny classifier on the 4x4 gray samples.
config() {
    cat >"$T/$1.json" <<JSON
{
  "train_batch_size": 5, "train_micro_batch_size_per_gpu": 5,
  "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
  "model": {"input": [1, 4, 4],
            "layers": [{"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc", "out": 5}],
            "loss": {"type": "cross_entropy"}},
  "data": {"train": $2,
           "eval": {"format": "webdataset", "urls": ["data/shard-000002.tar"]},
           "workers": 2},
  "train": {"epochs": 2, "seed": 3, "device": "cpu", "run_dir": "$T/run-$1"}
}
JSON
}
config wds '{"format": "webdataset", "urls": "data/shard-{000000..000002}.tar", "image": "png", "label": "cls"}'
if "$B" --quiet --config "$T/wds.json" --summary "$T/s.json" >/dev/null 2>"$T/err"; then
    ok "trains on 3 shards named by a brace pattern relative to the config"
else
    bad "train: $(cat "$T/err")"
fi
has "$T/s.json" '"eval' "the summary has the eval result"
"$B" bench-data --config "$T/wds.json" >"$T/bt" 2>"$T/err" || bad "bench-data: $(cat "$T/err")"
has "$T/bt" '"format": "webdataset"' "bench-data reads the format"
has "$T/bt" '"samples": 15' "bench-data reads all 15 samples in one epoch"
"$B" info "$T/data/shard-000001.tar" >"$T/info" 2>"$T/err" || bad "info: $(cat "$T/err")"
has "$T/info" "samples: 4" "info counts a shard's samples"

# pack --from webdataset: ctrain shards of the same samples in the same order train to the same losses.
if "$B" pack --from webdataset "$T/data/shard-{000000..000002}.tar" --out "$T/packed" >"$T/pk" 2>"$T/err"; then
    has "$T/pk" "packed 15 records" "pack --from webdataset packs every sample"
    config packed '{"format": "shard", "path": "packed"}'
    "$B" --quiet --config "$T/packed.json" --summary "$T/p.json" >/dev/null 2>"$T/err" || bad "train on packed: $(cat "$T/err")"
    loss() { sed 's/.*"train_loss":\([^,]*\),"eval_loss":\([^,]*\),.*/\1 \2/' "$1"; }
    [ -n "$(loss "$T/s.json")" ] && [ "$(loss "$T/s.json")" = "$(loss "$T/p.json")" ] &&
        ok "the packed shards train to the same train and eval loss ($(loss "$T/s.json"))" ||
        bad "losses differ: webdataset $(loss "$T/s.json"), packed $(loss "$T/p.json")"
else
    bad "pack --from webdataset: $(cat "$T/err")"
fi

# A member cut short: exit 3 naming the shard and the member.
head -c 560 "$T/data/shard-000002.tar" >"$T/cut" && mv "$T/cut" "$T/data/shard-000002.tar"
"$B" --quiet --config "$T/wds.json" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "a truncated member exits 3" || bad "truncated member: exit $rc"
has "$T/err" 'shard-000002.tar: member "part.2/sample000010.png" truncated' "the shard and member are named"
"$B" info "$T/data/shard-000002.tar" >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "info on it exits 3" || bad "info on a truncated shard: exit $rc"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
