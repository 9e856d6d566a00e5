#!/bin/sh
# End-to-end checkpoints on the CPU, on a generated IDX data set (random 16x16 images, 4 classes):
#  - kill -9 at a random step once a checkpoint exists, then --resume auto: final weights,
#    optimizer state and state.json (17-digit loss sums) byte-identical to an uninterrupted run;
#  - SIGINT and SIGTERM: exit 130/143, "saved DIR", a loadable checkpoint, and the resume also
#    ends byte-identical;
#  - keep_last, best/ (matches the best eval), early stopping, export -> model.init_from and
#    ctrain eval round trips, a shape change on resume (exit 2 naming the tensor), a truncated
#    model.safetensors (exit 3 naming the file), a bit flipped in it (exit 3: its checksum),
#    --resume auto with nothing saved starts fresh;
#  - with eval at each epoch's end, a checkpoint of that step holds the eval; the last step is
#    saved once.
# Usage: [CT_TEST_SEED=N] e2e_resume.sh BUILD_DIR; N seeds the kill step (printed with it).
# Needs python3 (it generates the data): missing, the test fails.
set -u
B=${1:-build}/ctrain
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "FAIL missing dependency: python3 (Debian's python3); make deps installs it"; exit 1; }
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
seed=${CT_TEST_SEED:-$(date +%s)}
case $seed in ''|*[!0-9]*) echo "FAIL: CT_TEST_SEED must be a non-negative integer, got '$seed'"; exit 1 ;; esac
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. test/lib_e2e.sh
# summary FILE EXPR DESCRIPTION: a Python expression over the summary dict s must be true
summary() {
    if "$PY" -c "import json,sys; s=json.load(open('$1')); sys.exit(0 if ($2) else 1)" 2>/dev/null; then
        ok "$3"
    else
        bad "$3: $(cat "$1" 2>/dev/null || echo 'no summary')"
    fi
}
# same DIR_A DIR_B DESCRIPTION: the two checkpoints hold the same bytes (state.json but for the
# config hash: the runs differ in train.run_dir)
same() {
    for f in model.safetensors optimizer.safetensors; do
        if ! cmp -s "$1/$f" "$2/$f"; then bad "$3: $f differs"; return; fi
    done
    grep -v config_hash "$1/state.json" >"$T/s1"
    grep -v config_hash "$2/state.json" >"$T/s2"
    if cmp -s "$T/s1" "$T/s2"; then ok "$3"; else bad "$3: state.json differs"; diff "$T/s1" "$T/s2" | head -6; fi
}

"$PY" - "$T" <<'EOF'
import gzip, random, struct, sys
r = random.Random(11)
def write(stem, n):
    with gzip.open(f"{sys.argv[1]}/{stem}-images.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 16, 16) + r.randbytes(n * 256))
    with gzip.open(f"{sys.argv[1]}/{stem}-labels.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(r.randrange(4) for _ in range(n)))
write("train", 2000)
write("eval", 200)
EOF
# mlp HIDDEN: the config with a hidden layer of HIDDEN (dropout keys its stream by micro-step, so
# a resume that got the counters wrong would differ).
mlp() {
    cat <<EOF
{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 16,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 250, "warmup_num_steps": 20}},
 "steps_per_print": 1,
 "model": {"input": [1, 16, 16], "layers": [{"type": "flatten", "name": "flat"},
   {"type": "linear", "name": "fc1", "out": $1}, {"type": "relu", "name": "r1"},
   {"type": "dropout", "name": "drop", "p": 0.1},
   {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "idx", "images": "train-images.gz", "labels": "train-labels.gz"},
          "eval": {"format": "idx", "images": "eval-images.gz", "labels": "eval-labels.gz"},
          "workers": 2, "transform": {"normalize": {"mean": [0.5], "std": [0.25]}}},
 "train": {"epochs": 4, "seed": 5, "device": "cpu", "eval_interval": 40, "save_interval": 25,
           "keep_last": 2}}
EOF
}
mlp 768 >"$T/c.json"
mlp 96 >"$T/c_shape.json"
C="$T/c.json"
final=global_step248   # 2000 samples, 32 per step, drop_last: 62 steps/epoch x 4

# --- uninterrupted reference run
"$B" --config "$C" --set train.run_dir=\""$T/a"\" --summary "$T/a.json" >/dev/null 2>"$T/a.err"
rc=$?
[ $rc -eq 0 ] && ok "reference run exits 0" || { bad "reference run (exit $rc)"; tail -5 "$T/a.err"; }
summary "$T/a.json" "s['status'] == 'ok' and s['steps'] == 248" "reference run: 248 steps"
[ -f "$T/a/config.json" ] && ok "run_dir/config.json written" || bad "no run_dir/config.json"
n=$(ls -d "$T"/a/checkpoints/global_step* | wc -l)
[ "$n" -eq 2 ] && ok "keep_last 2 leaves 2 checkpoints" || bad "keep_last 2 left $n checkpoints"
[ "$(cat "$T/a/checkpoints/latest")" = "$final" ] && ok "latest names $final" || bad "latest: $(cat "$T/a/checkpoints/latest")"

# best/: its step and value are those of the lowest eval loss printed
"$PY" - "$T/a.err" "$T/a/checkpoints/best/state.json" <<'EOF' && ok "best/ holds the best eval" || bad "best/ does not match the best eval"
import json, re, sys
evals = [(float(l.split()[6]), int(l.split()[2])) for l in open(sys.argv[1]) if l.startswith("eval  step")]
st = json.load(open(sys.argv[2]))
best = min(evals)
sys.exit(0 if len(evals) >= 6 and abs(st["best_value"] - best[0]) < 6e-5 and st["best_step"] == best[1] else 1)
EOF

# --- kill -9 at a random step after the first checkpoint, then resume auto
"$B" --config "$C" --set train.run_dir=\""$T/k"\" >/dev/null 2>"$T/k.err" &
pid=$!
# a random step K between the first checkpoint (25) and the last one (225), drawn from
# CT_TEST_SEED when it is set (to repeat a failure), else from the clock; printed either way
K=$(awk -v s="$seed" 'BEGIN { srand(s); printf "%d", 26 + rand() * 150 }')
echo "kill -9 at step $K (seed $seed: CT_TEST_SEED=$seed sh test/e2e_resume.sh repeats it)"
i=0
while [ $i -lt 1000 ] && ! grep -q "^step $K/" "$T/k.err"; do sleep 0.01; i=$((i + 1)); done
kill -9 $pid 2>/dev/null
wait $pid
rc=$?
at=$(grep -c '^step ' "$T/k.err")
if [ $rc -eq 137 ]; then ok "killed with -9 after step $at"; else bad "run was not killed (exit $rc)"; fi
"$B" --config "$C" --set train.run_dir=\""$T/k"\" --resume auto --summary "$T/k.json" >/dev/null 2>"$T/k2.err"
rc=$?
[ $rc -eq 0 ] && ok "resume after kill -9 exits 0" || { bad "resume after kill -9 (exit $rc)"; tail -5 "$T/k2.err"; }
has "$T/k2.err" "resuming from .*global_step" "resume names the checkpoint"
same "$T/a/checkpoints/$final" "$T/k/checkpoints/$final" "kill -9 + resume: weights, optimizer and state bitwise equal"
# the printed losses of the steps after the resume equal the reference run's
grep '^step ' "$T/k2.err" | sed 's/ETA.*//; s/[0-9.]* samples\/s//; s/data [0-9.]*%//' >"$T/k2.steps"
grep '^step ' "$T/a.err" | sed 's/ETA.*//; s/[0-9.]* samples\/s//; s/data [0-9.]*%//' | grep -F -x -f "$T/k2.steps" | wc -l >"$T/k2.n"
[ "$(cat "$T/k2.n")" -eq "$(wc -l <"$T/k2.steps")" ] && [ "$(cat "$T/k2.n")" -gt 0 ] \
    && ok "resumed steps print the reference run's losses" || bad "resumed step losses differ"
summary "$T/k.json" "s['status'] == 'ok' and s['steps'] == 248" "resumed summary: ok, 248 steps"

# --- SIGINT and SIGTERM: finish the step, save, exit 130/143; the resume ends equal
for sig in INT TERM; do
    code=130; [ $sig = TERM ] && code=143
    "$B" --config "$C" --set train.run_dir=\""$T/$sig"\" --summary "$T/$sig.json" >/dev/null 2>"$T/$sig.err" &
    pid=$!
    i=0
    while [ $i -lt 400 ] && ! grep -q '^step 3' "$T/$sig.err"; do sleep 0.02; i=$((i + 1)); done
    kill -$sig $pid
    wait $pid
    rc=$?
    [ $rc -eq $code ] && ok "SIG$sig exits $code" || bad "SIG$sig exit code $rc"
    has "$T/$sig.err" "interrupted by SIG$sig after step [0-9]*; saved .*global_step" "SIG$sig message names the checkpoint"
    summary "$T/$sig.json" "s['status'] == 'interrupted'" "SIG$sig summary status interrupted"
    "$B" info "$T/$sig/checkpoints" >/dev/null 2>&1 && ok "SIG$sig checkpoint loads (ctrain info)" || bad "SIG$sig checkpoint unreadable"
    "$B" --config "$C" --set train.run_dir=\""$T/$sig"\" --resume auto --quiet >/dev/null 2>"$T/$sig.2.err"
    rc=$?
    [ $rc -eq 0 ] && ok "SIG$sig resume exits 0" || { bad "SIG$sig resume (exit $rc)"; tail -3 "$T/$sig.2.err"; }
    same "$T/a/checkpoints/$final" "$T/$sig/checkpoints/$final" "SIG$sig + resume: bitwise equal"
done

# --- fp16 with a loss scale that overflows (skipped steps, halvings, hysteresis): stop at
# max_steps 98 (inside a doubling window: the scaler's phase matters), resume with max_steps
# removed (a hyperparameter change, reported), end equal
F16="--set fp16.enabled=true --set fp16.initial_scale_power=32 --set fp16.loss_scale_window=4 --set fp16.hysteresis=2"
# shellcheck disable=SC2086
"$B" --config "$C" --set train.run_dir=\""$T/h"\" $F16 --quiet --summary "$T/h.json" >/dev/null 2>"$T/h.err"
# shellcheck disable=SC2086
"$B" --config "$C" --set train.run_dir=\""$T/i"\" $F16 --set train.max_steps=98 --quiet >/dev/null 2>"$T/i.err"
# shellcheck disable=SC2086
"$B" --config "$C" --set train.run_dir=\""$T/i"\" $F16 --resume auto >/dev/null 2>"$T/i2.err"
rc=$?
[ $rc -eq 0 ] && ok "fp16 resume exits 0" || { bad "fp16 resume (exit $rc)"; tail -3 "$T/i2.err"; }
summary "$T/h.json" "s['skipped_steps'] > 5" "fp16 reference run skipped overflowing steps"
has "$T/i2.err" "train.max_steps: 98 -> 0" "resume lists the changed hyperparameter"
same "$T/h/checkpoints/$final" "$T/i/checkpoints/$final" "fp16 stop + resume: bitwise equal (loss scaler restored)"

# --- a checkpoint written before epoch_sample and the checksums were recorded (state.json
# without epoch_sample, COMPLETE without crc32): it loads, its position is epoch_step steps of its
# train_batch_size, and the resume ends equal to the uninterrupted run
cp -r "$T/a/checkpoints/global_step225" "$T/old225"
"$PY" - "$T/old225" <<'EOF'
import json, os, sys
d = sys.argv[1]
st = json.load(open(f"{d}/state.json"))
del st["epoch_sample"]
open(f"{d}/state.json", "w").write(json.dumps(st, indent=1) + "\n")
m = json.load(open(f"{d}/COMPLETE"))
del m["crc32"]
m["files"]["state.json"] = os.path.getsize(f"{d}/state.json")
open(f"{d}/COMPLETE", "w").write(json.dumps(m))
EOF
"$B" --config "$C" --set train.run_dir=\""$T/old"\" --resume "$T/old225" --quiet >/dev/null 2>"$T/old.err"
rc=$?
[ $rc -eq 0 ] && ok "a checkpoint without epoch_sample and checksums resumes" || { bad "old checkpoint (exit $rc)"; tail -3 "$T/old.err"; }
same "$T/a/checkpoints/$final" "$T/old/checkpoints/$final" "old checkpoint + resume: bitwise equal"
"$B" info "$T/old225" >"$T/old.info" 2>&1
has "$T/old.info" "checksums: none recorded" "ctrain info of an old checkpoint: no checksums recorded"

# --- a resume with another batch size continues at the sample where the checkpoint stopped. lr 0
# and no dropout: a step's loss is the mean loss of its samples, so a step of 64 samples equals the
# mean of four steps of 16 of the same samples. Reference: steps of 16; a run of steps of 32 (micro
# 16) saves at step 25 (sample 800 of epoch 1), resumed with steps of 64 in micro-batches of 64
# (800 is not a multiple of 64): 18 steps to the last whole step of the epoch (1952; drop_last
# drops 48), then epoch 2 from its first sample.
cat >"$T/lr0.json" <<EOF
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0}},
 "model": {"input": [1, 16, 16], "layers": [{"type": "flatten", "name": "flat"},
   {"type": "linear", "name": "fc1", "out": 32}, {"type": "relu", "name": "r1"},
   {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "idx", "images": "train-images.gz", "labels": "train-labels.gz"},
          "workers": 2, "transform": {"normalize": {"mean": [0.5], "std": [0.25]}}},
 "train": {"epochs": 2, "seed": 7, "device": "cpu", "max_steps": 133}}
EOF
"$B" --config "$T/lr0.json" --set train.run_dir=\""$T/b16"\" >/dev/null 2>"$T/b16.err"
"$B" --config "$T/lr0.json" --set train.run_dir=\""$T/b32"\" --set train_batch_size=32 --set train.max_steps=25 \
    >/dev/null 2>"$T/b32.err"
"$B" --config "$T/lr0.json" --set train.run_dir=\""$T/b32"\" --resume "$T/b32/checkpoints/global_step25" \
    --set train_batch_size=64 --set train_micro_batch_size_per_gpu=64 --set train.max_steps=45 \
    >/dev/null 2>"$T/b64.err"
rc=$?
[ $rc -eq 0 ] && ok "resume with steps of 64 from a checkpoint of steps of 32 exits 0" \
    || { bad "resume with another batch size (exit $rc)"; tail -3 "$T/b64.err"; }
"$PY" - "$T/b16.err" "$T/b64.err" "$T/b32/checkpoints/global_step45/state.json" <<'EOF' \
    && ok "another batch size: the resume takes the samples after the checkpoint's, in order" \
    || bad "another batch size: the resumed steps are not the samples after the checkpoint's"
import json, re, sys
def losses(path):
    return {int(m.group(1)): float(m.group(2)) for l in open(path)
            for m in [re.match(r"step (\d+)/\d+ .*  loss ([0-9.]+)", l)] if m}
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
# resumed step j: reference steps (the 16-sample steps of the same 64 samples)
want = {j: [50 + 4 * (j - 26) + i for i in range(1, 5)] for j in range(26, 44)}
want.update({j: [125 + 4 * (j - 44) + i for i in range(1, 5)] for j in (44, 45)})
bad = [(j, got.get(j), sum(ref[i] for i in r) / 4) for j, r in want.items()
       if j not in got or abs(got[j] - sum(ref[i] for i in r) / 4) > 1.5e-4]
st = json.load(open(sys.argv[3]))
epoch_line = any(re.match(r"epoch 1/\d+ done  step 43 ", l) for l in open(sys.argv[2]))
ok = not bad and sorted(got) == list(range(26, 46)) and epoch_line and st["epoch"] == 1 \
    and st["epoch_sample"] == 128 and st["samples_seen"] == 800 + 1152 + 128
if not ok:
    print("mismatched steps (step, got, want):", bad[:5], "epoch line at 43:", epoch_line,
          {k: st.get(k) for k in ("epoch", "epoch_sample", "samples_seen")})
sys.exit(0 if ok else 1)
EOF

# and at a sample where less than a step of the new size is left (sample 1960 of 2000 after 49
# steps of 40; steps of 48): the epoch is done, the next one starts from its first sample
"$B" --config "$T/lr0.json" --set train.run_dir=\""$T/b40"\" --set train_batch_size=40 --set train_micro_batch_size_per_gpu=20 \
    --set train.max_steps=49 \
    >/dev/null 2>"$T/b40.err"
"$B" --config "$T/lr0.json" --set train.run_dir=\""$T/b40"\" --resume "$T/b40/checkpoints/global_step49" \
    --set train_batch_size=48 --set train_micro_batch_size_per_gpu=48 --set train.max_steps=51 \
    >/dev/null 2>"$T/b48.err"
"$PY" - "$T/b16.err" "$T/b48.err" "$T/b40/checkpoints/global_step51/state.json" <<'EOF' \
    && ok "another batch size, less than a step left: the resume starts the next epoch" \
    || bad "another batch size, less than a step left in the epoch"
import json, re, sys
def losses(path):
    return {int(m.group(1)): float(m.group(2)) for l in open(path)
            for m in [re.match(r"step (\d+)/\d+ .*  loss ([0-9.]+)", l)] if m}
ref, got = losses(sys.argv[1]), losses(sys.argv[2])
want = {50: [126, 127, 128], 51: [129, 130, 131]}
ok = sorted(got) == [50, 51] and all(abs(got[j] - sum(ref[i] for i in r) / 3) <= 1.5e-4 for j, r in want.items())
st = json.load(open(sys.argv[3]))
ok = ok and st["epoch"] == 1 and st["epoch_sample"] == 96 and st["samples_seen"] == 1960 + 96
if not ok:
    print(got, {j: sum(ref[i] for i in r) / 3 for j, r in want.items()},
          {k: st.get(k) for k in ("epoch", "epoch_sample", "samples_seen")})
sys.exit(0 if ok else 1)
EOF

# --- the data set's fingerprint: a resume on changed data warns, naming the data set and what
# differs, and --strict-resume refuses it (exit 3); files only rewritten (another modification
# time, the same sizes and sampled bytes) get a note, never a refusal
mkdir -p "$T/d"
cp "$T/train-images.gz" "$T/train-labels.gz" "$T/lr0.json" "$T/d/"
"$B" --config "$T/d/lr0.json" --set train.run_dir=\""$T/d/run"\" --set train.max_steps=5 --quiet >/dev/null 2>"$T/d0.err"
ck5="$T/d/run/checkpoints/global_step5"
# resume RUN_NAME [OPTIONS]: one more step from global_step5
resume5() {
    n=$1; shift
    "$B" --config "$T/d/lr0.json" --set train.run_dir=\""$T/d/run"\" --set train.max_steps=6 --resume "$ck5" "$@" \
        >/dev/null 2>"$T/$n.err"
}
resume5 same --strict-resume
rc=$?
[ $rc -eq 0 ] && ok "--strict-resume on the same data exits 0" || { bad "--strict-resume, same data (exit $rc)"; tail -3 "$T/same.err"; }
grep -q "data.train" "$T/same.err" && bad "same data: the data set is mentioned" || ok "same data: nothing said about it"
sleep 0.01
touch "$T/d/train-images.gz"
resume5 touched --strict-resume
rc=$?
[ $rc -eq 0 ] && ok "files only rewritten: --strict-resume still resumes" || { bad "rewritten files with --strict-resume (exit $rc)"; tail -3 "$T/touched.err"; }
has "$T/touched.err" "^note: data.train .*rewritten or copied" "files only rewritten: a note"
grep -q "warning: data.train" "$T/touched.err" && bad "files only rewritten: a warning" || ok "files only rewritten: no warning"
"$PY" - "$T/d/train-images.gz" <<'EOF'
import gzip, random, struct, sys
r = random.Random(12)
with gzip.open(sys.argv[1], "wb", compresslevel=1) as f:
    f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, 2000, 16, 16) + r.randbytes(2000 * 256))
EOF
resume5 changed
rc=$?
[ $rc -eq 0 ] && ok "changed data without --strict-resume: resumes" || { bad "changed data (exit $rc)"; tail -3 "$T/changed.err"; }
has "$T/changed.err" "warning: data.train (.*train-images.gz) changed since .*global_step5 was saved: .*content" \
    "changed data: a warning naming the data set and what differs"
resume5 strict --strict-resume
rc=$?
[ $rc -eq 3 ] && ok "changed data with --strict-resume exits 3" || bad "changed data with --strict-resume: exit $rc"
has "$T/strict.err" "error: data.train (.*train-images.gz) changed since .*global_step5 was saved" "the refusal names the data set"

# --- resume errors: a shape change exits 2 naming the tensor (--resume auto: naming the run
# directory's config, before loading anything); a truncated file exits 3 naming it
"$B" --config "$T/c_shape.json" --set train.run_dir=\""$T/a"\" --resume auto --quiet >/dev/null 2>"$T/shape.err"
rc=$?
[ $rc -eq 2 ] && ok "another model with --resume auto exits 2" || bad "another model with --resume auto: exit $rc"
has "$T/shape.err" "holds the checkpoints of another config" "another model with --resume auto: the run_dir's config differs"
"$B" --config "$T/c_shape.json" --set train.run_dir=\""$T/a"\" --resume "$T/a/checkpoints" --quiet >/dev/null 2>"$T/shape.err"
rc=$?
[ $rc -eq 2 ] && ok "shape change on resume exits 2" || bad "shape change on resume: exit $rc"
has "$T/shape.err" "fc1.weight: \[768, 256\] in .*, \[96, 256\] in the model" "shape change names the tensor and both shapes"
cp -r "$T/a/checkpoints/$final" "$T/cut"
head -c 1000 "$T/a/checkpoints/$final/model.safetensors" >"$T/cut/model.safetensors"
"$B" --config "$C" --set train.run_dir=\""$T/x"\" --resume "$T/cut" --quiet >/dev/null 2>"$T/cut.err"
rc=$?
[ $rc -eq 3 ] && ok "truncated model.safetensors exits 3" || bad "truncated checkpoint: exit $rc"
has "$T/cut.err" "cut/model.safetensors" "truncated checkpoint names the file"
"$B" eval --config "$C" --checkpoint "$T/cut" --quiet >/dev/null 2>"$T/cut2.err"
rc=$?
[ $rc -eq 3 ] && ok "ctrain eval of a truncated checkpoint exits 3" || bad "eval of truncated checkpoint: exit $rc"
# a bit flipped in the tensor data (same size, valid header): the checksum in COMPLETE refuses it
# with exit 3, naming the file and the previous complete checkpoint; ctrain info says so too
cp -r "$T/a/checkpoints" "$T/flip"
"$PY" - "$T/flip/$final/model.safetensors" <<'EOF'
import random, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
start = 8 + struct.unpack("<Q", bytes(b[:8]))[0]
b[random.randrange(start, len(b))] ^= 1 << random.randrange(8)
open(sys.argv[1], "wb").write(b)
EOF
"$B" --config "$C" --set train.run_dir=\""$T/x"\" --resume "$T/flip" --quiet >/dev/null 2>"$T/flip.err"
rc=$?
[ $rc -eq 3 ] && ok "a flipped bit in model.safetensors exits 3" || bad "flipped bit: exit $rc"
has "$T/flip.err" "flip/$final/model.safetensors: checksum mismatch" "the flipped file is named"
has "$T/flip.err" "Resume from another checkpoint: --resume .*flip/global_step225" "the previous complete checkpoint is named"
"$B" info "$T/flip/$final" >"$T/flip.info" 2>&1
rc=$?
[ $rc -eq 3 ] && ok "ctrain info of it exits 3" || bad "ctrain info of a flipped checkpoint: exit $rc"
has "$T/flip.info" "checksums: MISMATCH" "ctrain info says the checksums do not match"
"$B" info "$T/a/checkpoints/$final" >"$T/a.info" 2>&1
has "$T/a.info" "checksums: match" "ctrain info of an intact checkpoint: checksums match"

# --- ctrain eval, export and model.init_from give the reference run's eval loss
"$B" eval --config "$C" --checkpoint "$T/a/checkpoints" --quiet --summary "$T/ev.json" >/dev/null 2>"$T/ev.err"
rc=$?
[ $rc -eq 0 ] && ok "ctrain eval exits 0" || { bad "ctrain eval (exit $rc)"; tail -3 "$T/ev.err"; }
summary "$T/ev.json" "s['status'] == 'ok' and s['steps'] == 248 and s['eval_loss'] == json.load(open('$T/a.json'))['eval_loss']" \
    "ctrain eval: the reference run's eval loss"
"$B" export --checkpoint "$T/a/checkpoints" --out "$T/w.safetensors" >/dev/null 2>"$T/ex.err" \
    && ok "export" || bad "export: $(cat "$T/ex.err")"
# one step at lr 0 (AdamW moves nothing) from the exported weights, then the end-of-run eval
"$B" --config "$C" --set train.run_dir=\""$T/f"\" --set model.init_from=\""$T/w.safetensors"\" \
    --set optimizer.params.lr=0 --set train.max_steps=1 --summary "$T/f.json" >/dev/null 2>"$T/f.err"
rc=$?
[ $rc -eq 0 ] && ok "init_from run exits 0" || { bad "init_from run (exit $rc)"; tail -3 "$T/f.err"; }
has "$T/f.err" "4 of 4 tensors loaded" "init_from reports the tensors loaded"
summary "$T/f.json" "s['eval_loss'] == json.load(open('$T/a.json'))['eval_loss']" "export + init_from: same eval loss"
"$B" --config "$T/c_shape.json" --set train.run_dir=\""$T/g"\" --set model.init_from=\""$T/w.safetensors"\" \
    --quiet >/dev/null 2>"$T/g.err"
rc=$?
[ $rc -eq 2 ] && ok "init_from with other shapes exits 2 (init_strict)" || bad "strict init_from mismatch: exit $rc"
has "$T/g.err" "fc1.weight" "init_from mismatch lists the tensor"

# --- early stopping (lr 0: eval loss never improves) and --resume auto with nothing saved
"$B" --config "$C" --set train.run_dir=\""$T/e"\" --set optimizer.params.lr=0 \
    --set train.early_stopping='{"metric": "eval_loss", "patience": 2}' --set train.eval_interval=5 \
    --resume auto --summary "$T/e.json" >/dev/null 2>"$T/e.err"
rc=$?
[ $rc -eq 0 ] && ok "early-stopped run exits 0" || { bad "early stopping run (exit $rc)"; tail -3 "$T/e.err"; }
has "$T/e.err" "no checkpoint in .* yet; starting fresh" "--resume auto with nothing saved starts fresh"
summary "$T/e.json" "s['status'] == 'early_stopped' and s['steps'] == 15" "early stopping: status early_stopped at step 15"
has "$T/e.err" "early stopping: eval_loss did not improve by 0 for 2 evals; best .* at step 5" "early stopping says why"
[ "$(cat "$T/e/checkpoints/latest")" = global_step15 ] && ok "early-stopped run saved its last step" \
    || bad "early stop checkpoint: latest $(cat "$T/e/checkpoints/latest" 2>/dev/null)"

# --- eval at each epoch's end (eval_interval 0) and save_interval 31 dividing the epoch (62
# steps): a checkpoint of an epoch's last step is written after that eval (its state.json holds
# it, best/ agrees with it), and the run's last step is saved once
"$B" --config "$T/c_shape.json" --set train.run_dir=\""$T/o"\" --set train.epochs=2 --set train.eval_interval=0 \
    --set train.save_interval=31 --set train.keep_last=0 >/dev/null 2>"$T/o.err"
rc=$?
[ $rc -eq 0 ] && ok "epoch-end eval run exits 0" || { bad "epoch-end eval run (exit $rc)"; tail -3 "$T/o.err"; }
"$PY" - "$T/o.err" "$T/o/checkpoints" <<'EOF' && ok "eval, then save: state.json holds the eval, best/ agrees, the last step saved once" \
    || bad "eval/save order at an epoch's end"
import json, re, sys
lines = open(sys.argv[1]).read().splitlines()
saves = [int(m.group(1)) for l in lines for m in [re.search(r"^saved .*global_step(\d+) ", l)] if m]
evals = [int(l.split()[2]) for l in lines if l.startswith("eval  step")]
ok = saves == [31, 62, 93, 124] and evals == [62, 124]
for s in (62, 124):   # the eval line comes before the save of its step
    ev = [i for i, l in enumerate(lines) if l.startswith(f"eval  step {s} ")]
    sv = [i for i, l in enumerate(lines) if re.search(rf"^saved .*global_step{s} ", l)]
    ok = ok and len(ev) == 1 and len(sv) == 1 and ev[0] < sv[0]
d = sys.argv[2]
st = {s: json.load(open(f"{d}/global_step{s}/state.json")) for s in (31, 62, 93, 124)}
ok = ok and [st[s]["last_eval_step"] for s in (31, 62, 93, 124)] == [-1, 62, 62, 124]
best = json.load(open(f"{d}/best/state.json"))
ok = ok and best["best_step"] in (62, 124)
for s in (62, 124):   # a checkpoint at or after the best eval records it as best/ does
    if s >= best["best_step"]:
        ok = ok and st[s]["best_step"] == best["best_step"] and st[s]["best_value"] == best["best_value"]
if not ok:
    print("saves", saves, "evals", evals, "last_eval_step", {s: st[s]["last_eval_step"] for s in st},
          "best", best["best_step"])
sys.exit(0 if ok else 1)
EOF

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
