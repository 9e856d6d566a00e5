#!/bin/sh
# sweep.sh: a grid over learning rate and batch size for one config, then a table of the points
# sorted by eval loss. Each point is an ordinary run with overrides: its own run directory
# (runs/<config name>/<time>: no run_dir given, so no point overwrites another's), no checkpoints
# (checkpoint.enabled false: a sweep keeps the summaries), and its summary in one JSON file per
# point, written even when the point fails (status "error" and the message).
#
# Usage: examples/sweep.sh CONFIG [MAX_STEPS]      (CTRAIN=path/to/ctrain to use another binary)
# Example: examples/sweep.sh configs/fmnist_mlp.json 200
set -u
CTRAIN=${CTRAIN:-build/ctrain}
CONFIG=${1:?usage: examples/sweep.sh CONFIG [MAX_STEPS]}
STEPS=${2:-200}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/sweep-XXXXXX") || exit 1
echo "summaries in $OUT" >&2
for lr in 3e-4 1e-3 3e-3; do
    for bs in 64 128; do
        # train_batch_size alone would keep the config's micro-batch; set both (no accumulation)
        "$CTRAIN" --config "$CONFIG" --quiet --set optimizer.params.lr="$lr" --set train_batch_size="$bs" \
            --set train_micro_batch_size_per_gpu="$bs" --set train.max_steps="$STEPS" \
            --set checkpoint.enabled=false --summary "$OUT/lr$lr-bs$bs.json" >/dev/null ||
            echo "point lr=$lr batch=$bs failed (exit $?); its summary says why" >&2
    done
done
python3 - "$OUT" <<'PY'
import glob, json, math, sys
rows = []
for path in glob.glob(sys.argv[1] + "/*.json"):
    s = json.load(open(path))
    h = s.get("hparams") or {}
    loss = s.get("eval_loss")
    rows.append((loss if loss is not None else math.inf, h.get("lr"), h.get("train_batch_size"),
                 s.get("eval_accuracy"), s.get("samples_per_s"), s["status"], s.get("run_dir", "")))
rows.sort(key=lambda r: r[0])
print(f"{'eval_loss':>9} {'lr':>8} {'batch':>5} {'accuracy':>8} {'samples/s':>9}  status  run_dir")
for loss, lr, bs, acc, rate, status, run_dir in rows:
    fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) and math.isfinite(v) else "-"
    print(f"{fmt(loss, '9.4f')} {fmt(lr, '8.0e')} {fmt(bs, '5d')} {fmt(acc, '8.4f')} {fmt(rate, '9.0f')}  "
          f"{status:6}  {run_dir}")
PY
