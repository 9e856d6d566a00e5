#!/bin/sh
# End-to-end: TensorBoard itself reads ctrain's event file (EventAccumulator): the tags
# DeepSpeed uses (Train/Samples/train_loss, lr, loss_scale under fp16) with one scalar per
# optimizer step at the global samples, the same values as csv_monitor's files (as float32), and
# each eval's Eval/Samples/eval_loss and eval_accuracy.
# Needs Python's tensorboard package (Debian has none): the python of the tests' virtual
# environment (.venv/, or $CT_TEST_VENV), which `make deps` makes; missing, the test fails.
# Usage: e2e_tensorboard.sh BUILD_DIR
set -u
B=${1:-build}/ctrain
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
. test/lib_e2e.sh
need_venv tensorboard
scratch_dir
B=$(cd "$(dirname "$B")" && pwd)/ctrain
cd "$T" || exit 1

random_csv train.csv 640 16 4 7
random_csv eval.csv 128 16 4 8
cat > run.json <<'JSON'
{"train_batch_size": 32,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "fp16": {"enabled": true},
 "tensorboard": {"enabled": true, "output_path": "tb", "job_name": "job"},
 "csv_monitor": {"enabled": true, "output_path": "csv", "job_name": "job"},
 "model": {"input": [16], "layers": [{"type": "linear", "name": "fc1", "out": 32}, {"type": "relu", "name": "r1"},
           {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}},
 "train": {"epochs": 3, "seed": 3, "device": "cpu", "threads": 1}}
JSON
"$B" --config run.json --quiet >out 2>err || { cat err; bad "train: exit $?"; exit 1; }
"$PY" - tb/job csv/job <<'PY' || bad "EventAccumulator's reading differs (above)"
import csv, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want = {"Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale",
        "Eval/Samples/eval_loss", "Eval/Samples/eval_accuracy"}
fails = 0
if tags != want:
    print("tags", sorted(tags), "expected", sorted(want)); fails += 1
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
for m in ("train_loss", "lr", "loss_scale"):
    ev = [(e.step, e.value) for e in acc.Scalars("Train/Samples/" + m)]
    with open("%s/Train_Samples_%s.csv" % (sys.argv[2], m), newline="") as f:
        rows = [(int(r[0]), f32(float(r[1]))) for r in list(csv.reader(f))[1:]]
    if ev != rows:
        print(m, "events", ev[:3], "... csv rows", rows[:3], "... (%d vs %d)" % (len(ev), len(rows))); fails += 1
    else:
        print("ok  ", m, len(ev), "scalars match csv_monitor")
ev = acc.Scalars("Eval/Samples/eval_loss")
if len(ev) < 1 or ev[-1].step != 1920 or not (0 < ev[-1].value < 10):
    print("eval_loss", ev); fails += 1
else:
    print("ok   eval_loss", len(ev), "scalars, the last at 1920 samples")
sys.exit(1 if fails else 0)
PY
[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
