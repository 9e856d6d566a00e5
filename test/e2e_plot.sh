#!/bin/sh
# End-to-end: `ctrain plot` on a real run's metrics.jsonl (a small MLP on a random CSV data set,
# 3 epochs with an eval each): the PNG has the requested size (read from its IHDR chunk), the
# default name and size, --out; a run directory without metrics.jsonl exits 3, a bad --size 2,
# a record in the middle that is not JSON is skipped with a warning naming file and line, a partial
# last line silently; a resume after a kill inside a metrics write starts on a fresh line;
# `ctrain compare` of two runs: the table (best eval loss first, each run's lr from its
# config.json) and, with --plot, their curves.
# (The pixels themselves are checked by test_plot.)
# Usage: e2e_plot.sh BUILD_DIR
set -u
. test/lib_e2e.sh
in_scratch "${1:-build}"

random_csv train.csv 512 16 4 7
random_csv eval.csv 64 16 4 8
cat > run.json <<'JSON'
{"train_batch_size": 32, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 20}},
 "model": {"input": [16], "layers": [{"type": "linear", "name": "fc1", "out": 32}, {"type": "relu", "name": "r1"},
           {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}},
 "train": {"epochs": 3, "seed": 3, "device": "cpu", "threads": 1, "run_dir": "r"}}
JSON
"$B" --config run.json --quiet >/dev/null 2>err || bad "training run: exit $?"
# png_size FILE: "WIDTHxHEIGHT" from the IHDR chunk, or why not
png_size() {
    python3 - "$1" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read(24)
if b[:8] != b"\x89PNG\r\n\x1a\n" or b[12:16] != b"IHDR": print("not a PNG")
else: print("%dx%d" % struct.unpack(">II", b[16:24]))
PY
}
"$B" plot r >out 2>err
eq "plot RUN_DIR: exit" "$?" 0
has out '^wrote r/curves.png (1200x800, 1 run)' "plot says what it wrote"
eq "default: r/curves.png at 1200x800" "$(png_size r/curves.png)" 1200x800
"$B" plot r --out small.png --size 640x480 >out 2>err
eq "--out --size: exit" "$?" 0
eq "--size 640x480" "$(png_size small.png)" 640x480

mkdir empty
"$B" plot empty >out 2>err
eq "no metrics.jsonl: exit" "$?" 3
has err 'empty/metrics.jsonl: cannot open: No such file or directory' "no metrics.jsonl: names the file"
"$B" plot r --size 10x480 >out 2>err
eq "--size 10x480: exit" "$?" 2
has err 'each 64..16384' "a bad size says the limits"
mkdir bad && { head -3 r/metrics.jsonl; echo 'not json'; tail -2 r/metrics.jsonl; } >bad/metrics.jsonl
"$B" plot bad >out 2>err
eq "a corrupt record: skipped, exit" "$?" 0
has err 'warning: .*bad/metrics.jsonl:4: not a JSON object (metrics.jsonl has one per line); skipped' \
    "a corrupt record: a warning names the file and line"
mkdir cut && { cat r/metrics.jsonl; printf '{"type":"train","st'; } >cut/metrics.jsonl
"$B" plot cut >out 2>err
eq "a partial last line (a killed run): exit" "$?" 0
# A run killed inside a metrics write, then resumed: the resume starts on a fresh line, so the part
# stays one bad line (it glued onto the next record, and plot refused the run)
cp -r r k && printf '{"type":"train","st' >>k/metrics.jsonl
"$B" --config run.json --set train.run_dir=k --set train.epochs=4 --resume auto --quiet >/dev/null 2>err ||
    bad "resumed run: exit $?"
eq "the cut record is a line of its own" "$(grep -c '^{"type":"train","st$' k/metrics.jsonl)" 1
"$B" plot k >out 2>err
eq "plot of the resumed run: exit" "$?" 0
has err 'k/metrics.jsonl:[0-9]*: not a JSON object .*skipped' "plot of the resumed run: the cut line is named"

# compare: a second run with a larger learning rate; the table best eval loss first, with each
# run's lr from its config.json; --plot their curves
"$B" --config run.json --set train.run_dir=r2 --set optimizer.params.lr=0.05 --quiet >/dev/null 2>err ||
    bad "second run: exit $?"
"$B" compare r r2 --plot both.png --size 800x600 >out 2>err
eq "compare: exit" "$?" 0
has out '^run  *steps  *loss  *eval_loss  *eval_acc  *lr  *batch  *micro  *dtype  *optim  *seed' "compare: the table's header"
eq "compare: a row per run" "$(grep -c '^r2\? ' out)" 2
python3 - out <<'PY' && ok "compare: best eval loss first, lr from config.json" || bad "compare: table order or lr"
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.split() and l.split()[0] in ("r", "r2")]
losses = [float(r[3]) for r in rows]
assert len(rows) == 2 and losses == sorted(losses), rows
assert {r[0]: r[5] for r in rows} == {"r": "0.01", "r2": "0.05"}, rows
PY
eq "compare --plot: the PNG's size" "$(png_size both.png)" 800x600
"$B" compare r empty >out 2>err
eq "compare with a directory without metrics: exit" "$?" 3
"$B" compare >out 2>err
eq "compare without runs: exit" "$?" 2

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
