#!/bin/sh
# End-to-end: what a run shows of itself, on a random CSV data set (16 features, 4 classes) and a
# small MLP, 20 steps of 32 samples an epoch, 3 epochs (60 steps, a fraction of a second):
#  - stderr not a terminal: a plain "step" line every steps_per_print steps; without
#    steps_per_print every 2 steps here (the default interval gives 20-50 lines: 30); no carriage
#    returns; --quiet: no step, epoch or eval lines, the summary on stdout; the gradient norm a
#    step line shows is computed for it (fp32 without clipping computes it nowhere else, and
#    training is the same without it);
#  - under a pseudo-terminal (script): the redrawn progress line and no plain step lines;
#  - run_dir/metrics.jsonl: one valid JSON object per logged step (at the right steps) and per eval;
#    after SIGTERM (the run saves and exits 143) every step up to the saved one;
#  - csv_monitor: DeepSpeed's file names, "step,<metric>" headers, CRLF rows, one row per optimizer
#    step at the global sample count (train_loss before the step, lr and loss_scale after), under
#    output_path/job_name; loss_scale only under fp16;
#  - tensorboard: one event file where DeepSpeed puts it, replaced by a fresh run (its contents:
#    test_tfevents and e2e_tensorboard); wandb enabled: a "not supported yet" warning;
#  - wall_clock_breakdown: a line per print window, the phases in metrics.jsonl, consistent;
#  - a config error still writes --summary, status "error" with the message.
# Usage: e2e_observe.sh BUILD_DIR
set -u
. test/lib_e2e.sh
in_scratch "${1:-build}"

random_csv train.csv 640 16 4 7
random_csv eval.csv 128 16 4 8
cat > run.json <<'JSON'
{"train_batch_size": 32,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "model": {"input": [16], "layers": [{"type": "linear", "name": "fc1", "out": 32}, {"type": "relu", "name": "r1"},
           {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}},
 "train": {"epochs": 3, "seed": 3, "device": "cpu", "threads": 1}}
JSON

# count FILE PATTERN: lines of FILE matching PATTERN
count() { grep -c -- "$2" "$1"; }

# --- plain step lines ---
"$B" --config run.json --set train.run_dir=r5 --set steps_per_print=5 >out 2>err || bad "steps_per_print 5: exit $?"
eq "steps_per_print 5: 60/5 step lines" "$(count err '^step ')" 12
has err '^step 60/60  epoch 3/3  loss ' "the last step line names step/total and epoch"
cp err err5
"$B" --config run.json --set train.run_dir=rd >out 2>err || bad "default: exit $?"
n=$(count err '^step ')
eq "no steps_per_print, not a terminal: default interval 2 -> 30 step lines" "$n" 30
if [ "$n" -ge 20 ] && [ "$n" -le 50 ]; then ok "default: 20-50 lines"; else bad "default: $n lines"; fi
if grep -q "$(printf '\r')" err; then bad "carriage return in a non-terminal log"; else ok "no carriage returns without a terminal"; fi
"$B" --config run.json --set train.run_dir=rq --set steps_per_print=1 --quiet >out 2>err || bad "--quiet: exit $?"
eq "--quiet: no step lines" "$(count err '^step ')" 0
eq "--quiet: nothing on stderr" "$(wc -c <err | tr -d ' ')" 0
has out '^{"status":"ok","steps":60' "--quiet: the summary on stdout"
# fp32 without clipping computes the gradient norm only on steps whose line shows it (none under
# --quiet): every line shows a number, and the steps without it train bit for bit the same
eq "steps_per_print 5: a number as grad-norm on every step line" "$(grep -c '^step .*grad-norm [0-9]' err5)" 12
if cmp -s r5/checkpoints/global_step60/model.safetensors rq/checkpoints/global_step60/model.safetensors; then
    ok "--quiet (no norm computed) trains bit for bit as steps_per_print 5: the same final weights"
else bad "--quiet and steps_per_print 5 end with other weights (or no checkpoint)"; ls r5 rq; fi

# --- a pseudo-terminal: the redrawn line (at most 4 times a second, and always at the last step, so
#     a fast machine that ends the run in under a quarter second still shows it) ---
if command -v script >/dev/null 2>&1; then
    random_csv big.csv 2048 64 4 5
    sed -e 's/"out": 32/"out": 1024/' -e 's/"input": \[16\]/"input": [64]/' \
        -e 's/"path": "train.csv"/"path": "big.csv"/' -e 's/"path": "eval.csv"/"path": "big.csv", "limit": 256/' \
        -e 's/"epochs": 3/"epochs": 8/' run.json >slow.json
    script -qec "'$B' --config slow.json --set train.run_dir=rt" /dev/null >tty.out 2>&1
    esc=$(printf '\033')
    if grep -a -q "${esc}\[Kstep [0-9]*/512  epoch [0-9]/8  loss [0-9.]*  lr " tty.out; then ok "terminal: a redrawn progress line"
    else bad "terminal: no redrawn progress line"; tail -c 400 tty.out; fi
    eq "terminal without steps_per_print: no plain step lines" "$(grep -a -c '^step ' tty.out)" 0
else
    bad "missing dependency: script(1) for a pseudo-terminal (Debian's bsdutils; make deps installs it)"
fi

# --- SIGTERM: the run saves a checkpoint and its metrics are on disk up to that step ---
if [ -f slow.json ]; then
    "$B" --config slow.json --set train.run_dir=rs --set steps_per_print=1 >sig.out 2>sig.err &
    pid=$!
    n=0
    while ! grep -q '^step 3/' sig.err 2>/dev/null && [ $n -lt 500 ]; do n=$((n + 1)); sleep 0.02; done
    kill -TERM $pid
    wait $pid
    eq "SIGTERM: exit 143" $? 143
    last=$(sed -n 's/.*"steps":\([0-9]*\).*/\1/p' sig.out)
    got=$(grep -c '"type":"train"' rs/metrics.jsonl)
    if [ -n "$last" ] && [ "$got" = "$last" ] && [ -d "rs/checkpoints/global_step$last" ]; then
        ok "SIGTERM: metrics.jsonl has every step up to the saved one ($got)"
    else
        bad "SIGTERM: $got train records, stopped at step '$last'"
    fi
fi

# --- metrics.jsonl ---
"$B" --config run.json --set train.run_dir=rm --set steps_per_print=7 --quiet >out 2>err || bad "metrics: exit $?"
M=rm/metrics.jsonl
[ -f $M ] && ok "metrics.jsonl in the run directory" || bad "no $M"
eq "metrics.jsonl: 8 logged steps (7..56) + 3 evals" "$(wc -l <$M | tr -d ' ')" 11
if [ -x /usr/bin/python3 ]; then
    /usr/bin/python3 - "$M" >py.out 2>&1 <<'PY'
import json, math, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in recs if r["type"] == "train"]
evals = [r for r in recs if r["type"] == "eval"]
assert [r["step"] for r in train] == list(range(7, 57, 7)), [r["step"] for r in train]
assert [r["step"] for r in evals] == [20, 40, 60], [r["step"] for r in evals]
for r in train:
    for k in ("epoch", "loss", "lr", "samples_per_s", "data_wait_share", "wall_s"):
        assert isinstance(r[k], (int, float)) and math.isfinite(r[k]), (k, r)
    assert r["loss_scale"] is None and r["tokens_per_s"] is None, r
    assert r["epoch"] == (r["step"] - 1) // 20 + 1 and r["lr"] == 0.01 and 0 <= r["data_wait_share"] <= 1, r
for r in evals:
    assert 0 <= r["eval_accuracy"] <= 1 and r["eval_loss"] > 0 and r["eval_perplexity"] is None, r
walls = [r["wall_s"] for r in recs]
assert walls == sorted(walls), walls
print("checked", len(recs))
PY
    if [ $? -eq 0 ]; then ok "metrics.jsonl: valid JSON, the logged steps and evals, finite values"
    else bad "metrics.jsonl content"; cat py.out; fi
fi
summary_eval=$(sed -n 's/.*"eval_loss":\([^,]*\),.*/\1/p' out)
last_eval=$(tail -1 $M | sed -n 's/.*"eval_loss":\([^,]*\),.*/\1/p')
awk -v a="$summary_eval" -v b="$last_eval" 'BEGIN { exit !(a > 0 && (a - b) ^ 2 < 1e-8) }' &&
    ok "the last eval record is the summary's eval loss ($last_eval)" || bad "last eval $last_eval, summary $summary_eval"

# --- csv_monitor, DeepSpeed's layout ---
"$B" --config run.json --set train.run_dir=rc --set 'csv_monitor={"enabled": true, "output_path": "mon", "job_name": "job1"}' \
    --quiet >out 2>err || bad "csv_monitor: exit $?"
for m in train_loss lr; do
    f=mon/job1/Train_Samples_$m.csv
    if [ -f "$f" ]; then ok "csv_monitor: $f"; else bad "csv_monitor: no $f"; continue; fi
    eq "$m: header" "$(head -1 "$f")" "$(printf 'step,%s\r' $m)"
    eq "$m: 60 rows + header" "$(wc -l <"$f" | tr -d ' ')" 61
    eq "$m: every line ends in CRLF" "$(grep -c "$(printf '\r')\$" "$f")" 61
done
eq "train_loss: first row at 0 samples" "$(sed -n 2p mon/job1/Train_Samples_train_loss.csv | cut -d, -f1)" 0
eq "train_loss: last row at 59 x 32 samples" "$(tail -1 mon/job1/Train_Samples_train_loss.csv | cut -d, -f1)" 1888
eq "lr: rows at the samples after the step" "$(sed -n 2p mon/job1/Train_Samples_lr.csv | tr -d '\r')" "32,0.01"
[ -f mon/job1/Train_Samples_loss_scale.csv ] && bad "loss_scale file without fp16" || ok "no loss_scale file in fp32"
"$B" --config run.json --set train.run_dir=rf --set fp16.enabled=true --set 'csv_monitor={"enabled": true}' \
    --quiet >out 2>err || bad "csv_monitor fp16: exit $?"
f=rf/DeepSpeedJobName/Train_Samples_loss_scale.csv
if [ -f $f ]; then
    eq "fp16: loss_scale header and first row" "$(head -2 $f | tr -d '\r' | tr '\n' ' ')" "step,loss_scale 32,65536.0 "
    eq "fp16: loss_scale rows" "$(wc -l <$f | tr -d ' ')" 61
else
    bad "fp16: no $f (empty output_path: run_dir/job_name)"
fi

# --- tensorboard: one event file under output_path/job_name (run_dir/job_name when output_path is
# empty); a fresh run replaces it; wandb still not supported ---
"$B" --config run.json --set train.run_dir=rb --set 'tensorboard={"enabled": true}' --set 'wandb={"enabled": true}' \
    --set train.max_steps=1 >out 2>err || bad "tensorboard: exit $?"
grep -q "tensorboard.*not supported" err && bad "tensorboard: still warned 'not supported'" || ok "tensorboard: no warning"
grep -q "read but not used.*tensorboard" err && bad "tensorboard: listed as read but not used" || ok "tensorboard: not listed unused"
has err "warning: wandb.enabled true: not supported yet" "wandb enabled: said plainly"
eq "tensorboard: one event file in run_dir/DeepSpeedJobName" "$(ls rb/DeepSpeedJobName | grep -c '^events.out.tfevents\.')" 1
sleep 1 # the next file's name differs by its seconds
"$B" --config run.json --set train.run_dir=rb --set 'tensorboard={"enabled": true, "output_path": "tb", "job_name": "j"}' \
    --quiet >out 2>err || bad "tensorboard output_path: exit $?"
eq "tensorboard: one event file in output_path/job_name" "$(ls tb/j | grep -c '^events.out.tfevents\.')" 1
# the file's first record: 8-byte length, 4-byte CRC, then Event{wall_time, step, "brain.Event:2"}
grep -q "brain.Event:2" tb/j/events.out.tfevents.* && ok "tensorboard: file_version event" || bad "tensorboard: no brain.Event:2"
grep -q "Train/Samples/train_loss" tb/j/events.out.tfevents.* && ok "tensorboard: train_loss tag" || bad "tensorboard: no train_loss tag"
"$B" --config run.json --set train.run_dir=rb --set 'tensorboard={"enabled": true, "output_path": "tb", "job_name": "j"}' \
    --set train.max_steps=1 --quiet >out 2>err || bad "tensorboard again: exit $?"
eq "tensorboard: a fresh run replaces the earlier file" "$(ls tb/j | grep -c '^events.out.tfevents\.')" 1
has err "warning: a fresh run replaced an earlier run's TensorBoard event files in tb/j" "tensorboard: the replacement is said"

# --- wall_clock_breakdown: one "time (ms)" line per print window (60 steps / 5 = 12) and the
# window's phase means in each train record of metrics.jsonl: non-negative, the phases summing to
# at most the step, and 5 steps at most the window's wall time (wall_s to wall_s) ---
"$B" --config run.json --set train.run_dir=rw --set wall_clock_breakdown=true --set steps_per_print=5 \
    --set train_micro_batch_size_per_gpu=16 >out 2>err || bad "wall_clock_breakdown: exit $?"
eq "wall_clock_breakdown: a line per window" "$(count err '^time (ms) per step, mean of steps [0-9]*-[0-9]*: data wait ')" 12
has err '^time (ms) per step, mean of steps 56-60: ' "wall_clock_breakdown: the last window's steps"
grep -q "wall_clock_breakdown.*not used" err && bad "wall_clock_breakdown: still 'not used'" || ok "wall_clock_breakdown: no 'not used' line"
python3 - rw/metrics.jsonl <<'PY' && ok "wall_clock_breakdown: phases >= 0, sum <= step, steps <= window" || bad "wall_clock_breakdown: metrics.jsonl phases (above)"
import json, sys
recs = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"]
assert len(recs) == 12, len(recs)
prev = 0.0
for r in recs:
    ph = [r[k] for k in ("data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms")]
    assert all(v >= 0 for v in ph) and r["forward_ms"] > 0 and r["backward_ms"] > 0, r
    assert sum(ph) <= r["step_ms"] * (1 + 1e-9), r
    assert 5 * r["step_ms"] <= (r["wall_s"] - prev) * 1e3 * (1 + 1e-9), (r, prev)
    prev = r["wall_s"]
PY
[ -f r5/metrics.jsonl ] && ! grep -q '"step_ms"' r5/metrics.jsonl && ok "no breakdown fields when off" || bad "breakdown fields without wall_clock_breakdown"

# --- a config error still writes --summary ---
"$B" --config run.json --set train_batch_size=-3 --summary s.json >out 2>err
eq "config error: exit 2" $? 2
if [ -f s.json ]; then
    has s.json '^{"status":"error"' "config error: --summary written, status error"
    has s.json '"error":".*train_batch_size' "config error: the summary names the key"
else
    bad "config error: no --summary file"
fi
"$B" --config run.json --set train_batch_size=-3 --summary run.json >out 2>err
has run.json '"train_batch_size": 32' "config error: --summary naming the config leaves it alone"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
