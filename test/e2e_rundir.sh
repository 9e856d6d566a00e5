#!/bin/sh
# End-to-end: run directories, their lock, output paths and the summary file, on a generated IDX
# data set (random 8x8 images, 4 classes; a run is 10 steps and takes a fraction of a second):
#  - two configs both named ds_config.json given the same run_dir runs/ds_config: the second
#    exits 2 naming both files (fresh and --resume auto) and leaves the first's checkpoints as
#    they were; the same config resumes, a longer run resumes, an explicit --resume with another
#    learning rate goes on and lists the difference;
#  - a run directory in use (a stopped run holds it) refuses a second run with exit 2 naming the
#    holder's pid, while eval and --dry-run still work; after kill -9 the lock is gone;
#  - an unwritable train.save_dir, train.run_dir or --summary exits 2 before any step, and so
#    does a --summary naming an input (the config, a dataset file through a link) or a file of
#    ctrain's (in save_dir, run_dir/config.json), for ctrain eval too; the file left intact; export
#    --out, plot --out and --summary over another run's latest, config.json or metrics.jsonl too;
#  - --resume auto over incomplete checkpoints only: exit 3 naming what is damaged; a fresh run
#    beside them (no --resume) leaves them to keep_last; keep_last applied at the start (a kill between latest and pruning), foreign and
#    incomplete checkpoints left alone;
#  - --summary on a full file system (a 64 KiB tmpfs; skipped when mount is not permitted): a
#    message on stderr, exit 0 because the final checkpoint is saved, no empty file, and an old
#    summary survives;
#  - --summary through a symbolic link (the link stays), into a FIFO and into device nodes made
#    here (they stay devices; the full one is a message and exit 0).
# Usage: e2e_rundir.sh BUILD_DIR. Needs python3 (it generates the data): missing, the test fails.
set -u
B=$(cd "$(dirname "${1:-build}/ctrain")" && pwd)/ctrain
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "FAIL missing dependency: python3 (Debian's python3); make deps installs it"; exit 1; }
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
T=$(mktemp -d)
cleanup() {
    [ -n "${held:-}" ] && kill -9 "$held" 2>/dev/null
    mountpoint -q "$T/full" 2>/dev/null && umount "$T/full"
    rm -rf "$T"
}
trap cleanup EXIT
. test/lib_e2e.sh
# code RC WANT DESCRIPTION [ERRFILE]: the exit status is WANT, else show the end of ERRFILE
code() {
    if [ "$1" -eq "$2" ]; then ok "$3"; else bad "$3: exit $1, expected $2"; [ -n "${4:-}" ] && tail -4 "$4" | sed 's/^/     /'; fi
}
# untrained ERRFILE DESCRIPTION: the run printed no step line
untrained() { if grep -q '^step ' "$1"; then bad "$2: it trained"; else ok "$2"; fi; }

"$PY" - "$T" <<'EOF'
import gzip, random, struct, sys
r = random.Random(7)
def write(stem, n):
    with gzip.open(f"{sys.argv[1]}/{stem}-images.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 8, 8) + r.randbytes(n * 64))
    with gzip.open(f"{sys.argv[1]}/{stem}-labels.gz", "wb", compresslevel=1) as f:
        f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + bytes(r.randrange(4) for _ in range(n)))
write("train", 160)
write("eval", 40)
EOF
# cfg LR: 10 steps of 16 samples, a checkpoint every 2 steps, keep_last 2
cfg() {
    cat <<EOF
{"train_batch_size": 16, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": $1}},
 "model": {"input": [1, 8, 8], "layers": [{"type": "flatten", "name": "flat"},
   {"type": "linear", "name": "fc1", "out": 16}, {"type": "relu", "name": "r1"},
   {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "idx", "images": "../train-images.gz", "labels": "../train-labels.gz"},
          "eval": {"format": "idx", "images": "../eval-images.gz", "labels": "../eval-labels.gz"},
          "transform": {"normalize": {"mean": [0.5], "std": [0.25]}}},
 "train": {"epochs": 1, "seed": 5, "device": "cpu", "threads": 1, "save_interval": 2, "keep_last": 2}}
EOF
}
mkdir -p "$T/expA" "$T/expB"
cfg 0.01 >"$T/expA/ds_config.json"
cfg 0.02 >"$T/expB/ds_config.json"
# in T; both given the same run_dir, runs/ds_config (without one each run would get its own
# runs/ds_config/<timestamp>: test/e2e_smoke.sh)
C() { (cd "$T" && exec "$B" "$@"); }
S="--set train.run_dir=runs/ds_config"
R="$T/runs/ds_config/checkpoints"

# --- two configs named ds_config.json: the second must not take over the first's run_dir
C --config expA/ds_config.json $S --quiet >/dev/null 2>"$T/a.err"
code $? 0 "run A" "$T/a.err"
cp "$R/global_step10/model.safetensors" "$T/a10.safetensors"
C --config expB/ds_config.json $S >/dev/null 2>"$T/b.err"
code $? 2 "run B in A's run_dir exits 2" "$T/b.err"
untrained "$T/b.err" "run B did not train"
has "$T/b.err" "expA/ds_config.json" "the refusal names A's config file"
has "$T/b.err" "expB/ds_config.json" "the refusal names B's config file"
has "$T/b.err" "optimizer.params.lr: 0.01 -> 0.02" "the refusal lists the difference"
has "$T/b.err" "train.run_dir" "the refusal says to pass train.run_dir"
C --config expB/ds_config.json $S --resume auto >/dev/null 2>"$T/b2.err"
code $? 2 "run B with --resume auto in A's run_dir exits 2" "$T/b2.err"
if grep -q "resuming from" "$T/b2.err"; then bad "B resumed from A's weights"; else ok "B did not resume from A's weights"; fi
cmp -s "$R/global_step10/model.safetensors" "$T/a10.safetensors" && [ "$(cat "$R/latest")" = global_step10 ] \
    && ok "A's checkpoints untouched" || bad "A's checkpoints changed"
C --config expB/ds_config.json --set train.run_dir=runs/b --quiet >/dev/null 2>"$T/b3.err"
code $? 0 "run B with its own train.run_dir" "$T/b3.err"
C --config expA/ds_config.json $S --resume auto --set train.epochs=2 >/dev/null 2>"$T/a2.err"
code $? 0 "A resumes with more epochs (--resume auto)" "$T/a2.err"
has "$T/a2.err" "resuming from .*global_step10" "A resumed from its own checkpoint"
has "$T/a2.err" "train.epochs: 1 -> 2" "the longer run lists its change"

# --- the run directory lock: a stopped run holds it
# (100000 epochs: it must still be running when stopped; it is killed below)
(cd "$T" && exec "$B" --config expA/ds_config.json --set train.run_dir=runs/lock --set train.epochs=100000) \
    >/dev/null 2>"$T/l1.err" &
held=$!   # ctrain's pid: the subshell execs it
i=0
while [ $i -lt 2000 ] && ! grep -q "saved .*global_step2 " "$T/l1.err" 2>/dev/null; do sleep 0.01; i=$((i + 1)); done
kill -STOP $held
C --config expA/ds_config.json --set train.run_dir=runs/lock --resume auto >/dev/null 2>"$T/l2.err"
code $? 2 "a second run in a run_dir in use exits 2" "$T/l2.err"
untrained "$T/l2.err" "the second run did not train"
has "$T/l2.err" "in use by .*pid $held" "the refusal names the holder's pid"
C eval --config expA/ds_config.json --set train.run_dir=runs/lock --checkpoint runs/lock/checkpoints \
    --quiet >/dev/null 2>"$T/l3.err"
code $? 0 "ctrain eval while the run_dir is in use" "$T/l3.err"
C --config expA/ds_config.json --set train.run_dir=runs/lock --dry-run >/dev/null 2>"$T/l4.err"
code $? 0 "--dry-run while the run_dir is in use" "$T/l4.err"
kill -CONT $held
kill -9 $held
wait $held 2>/dev/null
held=
C --config expA/ds_config.json --set train.run_dir=runs/lock --resume auto --quiet >/dev/null 2>"$T/l5.err"
code $? 0 "after kill -9 of the holder the run_dir can be used" "$T/l5.err"

# --- output paths checked before training
echo "a file, not a directory" >"$T/plain"
C --config expA/ds_config.json --set train.run_dir=runs/o1 --set train.save_dir=\""$T/plain/ckpt"\" >/dev/null 2>"$T/o1.err"
code $? 2 "unwritable train.save_dir exits 2" "$T/o1.err"
untrained "$T/o1.err" "unwritable train.save_dir: found before training"
has "$T/o1.err" "train.save_dir.*plain" "the message names train.save_dir and the path"
C --config expA/ds_config.json --set train.run_dir=\""$T/plain/run"\" >/dev/null 2>"$T/o2.err"
code $? 2 "unwritable train.run_dir exits 2" "$T/o2.err"
has "$T/o2.err" "train.run_dir.*plain" "the message names train.run_dir and the path"
C --config expA/ds_config.json --set train.run_dir=runs/o3 --summary "$T/plain/s.json" >/dev/null 2>"$T/o3.err"
code $? 2 "unwritable --summary exits 2" "$T/o3.err"
untrained "$T/o3.err" "unwritable --summary: found before training"
has "$T/o3.err" "summary.*plain/s.json" "the message names --summary and the path"
# --summary naming an input (a dataset file through a link, the config): refused, the input intact
ln -s ../train-labels.gz "$T/expA/labels-link"
cp "$T/train-labels.gz" "$T/labels.orig"
cp "$T/expA/ds_config.json" "$T/config.orig"
C --config expA/ds_config.json --set train.run_dir=runs/o4 --summary expA/labels-link >/dev/null 2>"$T/o4.err"
code $? 2 "--summary naming a dataset file exits 2" "$T/o4.err"
untrained "$T/o4.err" "--summary naming a dataset file: found before training"
has "$T/o4.err" "train-labels.gz, an input" "the message names the dataset file"
if cmp -s "$T/train-labels.gz" "$T/labels.orig"; then ok "the dataset file is intact"; else bad "the dataset file was replaced"; fi
C --config expA/ds_config.json --set train.run_dir=runs/o5 --summary expA/ds_config.json >/dev/null 2>"$T/o5.err"
code $? 2 "--summary naming the config exits 2" "$T/o5.err"
if cmp -s "$T/expA/ds_config.json" "$T/config.orig"; then ok "the config is intact"; else bad "the config was replaced"; fi
# --summary over ctrain's own files: a checkpoint's (run A's latest), run_dir/config.json
cp "$R/latest" "$T/latest.orig"
C --config expA/ds_config.json $S --resume auto --set train.epochs=2 --summary runs/ds_config/checkpoints/latest >/dev/null 2>"$T/o6.err"
code $? 2 "--summary inside train.save_dir exits 2" "$T/o6.err"
has "$T/o6.err" "inside train.save_dir" "the message says where"
if cmp -s "$R/latest" "$T/latest.orig"; then ok "latest is intact"; else bad "latest was replaced"; fi
C --config expA/ds_config.json --set train.run_dir=runs/o7 --summary runs/o7/config.json >/dev/null 2>"$T/o7.err"
code $? 2 "--summary naming run_dir/config.json exits 2" "$T/o7.err"
# ctrain eval: --summary naming the config (before it loads), a checkpoint file, a dataset file
C eval --config expA/ds_config.json --checkpoint runs/ds_config/checkpoints --summary expA/ds_config.json >/dev/null 2>"$T/e1.err"
code $? 2 "eval --summary naming the config exits 2" "$T/e1.err"
if cmp -s "$T/expA/ds_config.json" "$T/config.orig"; then ok "eval: the config is intact"; else bad "eval: the config was replaced"; fi
M=$(ls -d "$R"/global_step* | tail -1)/model.safetensors
cp "$M" "$T/m.orig"
C eval --config expA/ds_config.json --checkpoint runs/ds_config/checkpoints --summary "$M" >/dev/null 2>"$T/e2.err"
code $? 2 "eval --summary naming a checkpoint file exits 2" "$T/e2.err"
if cmp -s "$M" "$T/m.orig"; then ok "eval: the checkpoint is intact"; else bad "eval: the checkpoint was replaced"; fi
C eval --config expA/ds_config.json --checkpoint runs/ds_config/checkpoints --summary eval-images.gz >/dev/null 2>"$T/e3.err"
code $? 2 "eval --summary naming a dataset file exits 2" "$T/e3.err"
C eval --config expA/ds_config.json --checkpoint runs/ds_config/checkpoints --summary "$T/e4.json" >/dev/null 2>"$T/e4.err"
code $? 0 "eval --summary elsewhere" "$T/e4.err"
status_ok() { grep -q '"status":"ok"' "$1"; }
if status_ok "$T/e4.json"; then ok "eval --summary written"; else bad "eval --summary not written"; fi
# Outputs over the files another run keeps (run A's latest, config.json, metrics.jsonl): export
# --out, plot --out, a run's and eval's --summary, also a run refused at start, exit 2 (export and a
# summary used to replace them), every file intact
A="$T/runs/ds_config"
for f in checkpoints/latest config.json metrics.jsonl; do cp "$A/$f" "$T/orig.$(basename "$f")"; done
G=$(ls -d "$R"/global_step* | tail -1)
for f in checkpoints/latest config.json metrics.jsonl; do
    C export --checkpoint "$G" --out "runs/ds_config/$f" >/dev/null 2>"$T/x.err"
    code $? 2 "export --out over run A's $f exits 2" "$T/x.err"
    has "$T/x.err" "export: --out runs/ds_config/$f is the .*$(basename "$f"); writing there would replace a file ctrain keeps" \
        "export: the message names A's $f"
done
C plot runs/ds_config --out runs/ds_config/metrics.jsonl >/dev/null 2>"$T/x.err"
code $? 2 "plot --out over A's metrics.jsonl exits 2" "$T/x.err"
C --config expA/ds_config.json --set train.run_dir=runs/o8 --summary runs/ds_config/metrics.jsonl >/dev/null 2>"$T/x.err"
code $? 2 "a run's --summary over A's metrics.jsonl exits 2" "$T/x.err"
untrained "$T/x.err" "--summary over A's metrics.jsonl: found before training"
C --config expA/nope.json --summary runs/ds_config/config.json >/dev/null 2>"$T/x.err"
code $? 2 "a run refused at start: its --summary over A's config.json is not written" "$T/x.err"
C eval --config expA/ds_config.json --checkpoint runs/b/checkpoints --summary runs/ds_config/metrics.jsonl >/dev/null 2>"$T/x.err"
code $? 2 "eval --summary over A's metrics.jsonl exits 2" "$T/x.err"
for f in checkpoints/latest config.json metrics.jsonl; do
    if cmp -s "$A/$f" "$T/orig.$(basename "$f")"; then ok "A's $f is intact"; else bad "A's $f was replaced"; fi
done

# --- --resume auto over incomplete checkpoints only: exit 3 naming the damaged file and how to start
# fresh deliberately (it started from scratch with exit 0); without --resume the run starts beside
# them, each reported, none removed by keep_last
C --config expA/ds_config.json --set train.run_dir=runs/inc --quiet >/dev/null 2>"$T/i1.err"
I="$T/runs/inc/checkpoints"
for s in 1 3; do cp -r "$I/global_step8" "$I/global_step$s"; rm "$I/global_step$s/COMPLETE"; done
rm -rf "$I/global_step8" "$I/global_step10" "$I/best" "$I/latest"
C --config expA/ds_config.json --set train.run_dir=runs/inc --resume auto --quiet >/dev/null 2>"$T/i2.err"
code $? 3 "--resume auto with only incomplete checkpoints exits 3" "$T/i2.err"
has "$T/i2.err" "error: --resume auto: .*checkpoints holds no checkpoint that can be loaded; the newest, .*global_step3: incomplete checkpoint" \
    "the error names the newest and why it cannot be loaded"
has "$T/i2.err" "To start fresh deliberately, run without --resume" "and how to start fresh deliberately"
untrained "$T/i2.err" "--resume auto over incomplete checkpoints did not train"
C --config expA/ds_config.json --set train.run_dir=runs/inc --quiet >/dev/null 2>"$T/i3.err"
code $? 0 "without --resume the run starts beside them" "$T/i3.err"
[ -d "$I/global_step1" ] && [ -d "$I/global_step3" ] && ok "incomplete checkpoints not removed by keep_last" \
    || bad "incomplete checkpoints removed: $(ls "$I")"
has "$T/i3.err" "global_step3: not a complete checkpoint" "each incomplete checkpoint is reported"

# --- keep_last at the start: a kill between latest and pruning left too many
P="$T/runs/ds_config/checkpoints"
cp -r "$P/global_step18" "$P/global_step4"
cp -r "$P/global_step18" "$P/global_step6"
cp -r "$T/runs/b/checkpoints/global_step8" "$P/global_step2"   # B's: another config
C --config expA/ds_config.json $S --resume auto --set train.epochs=2 --quiet >/dev/null 2>"$T/p.err"
code $? 0 "resume at the last step" "$T/p.err"
[ ! -d "$P/global_step4" ] && [ ! -d "$P/global_step6" ] && ok "keep_last applied at the start" \
    || bad "keep_last not applied at the start: $(ls "$P" | tr '\n' ' ')"
[ -d "$P/global_step18" ] && [ -d "$P/global_step20" ] && ok "the newest keep_last checkpoints kept" \
    || bad "keep_last removed too much: $(ls "$P" | tr '\n' ' ')"
[ -d "$P/global_step2" ] && ok "another config's checkpoint left alone" || bad "another config's checkpoint removed"
has "$T/p.err" "global_step2: saved by another config" "another config's checkpoint is reported"

# --- an explicit --resume with another learning rate goes on and lists the change
C --config expB/ds_config.json $S --resume runs/ds_config/checkpoints --set train.epochs=3 >/dev/null 2>"$T/x.err"
code $? 0 "explicit --resume with another learning rate" "$T/x.err"
has "$T/x.err" "optimizer.params.lr: 0.01 -> 0.02" "the explicit resume lists the change"

# --- --summary on a full file system
mkdir "$T/full"
if mount -t tmpfs -o size=64k tmpfs "$T/full" 2>/dev/null; then
    echo '{"old": true}' >"$T/full/s.json"
    dd if=/dev/zero of="$T/full/fill" bs=4k count=64 2>/dev/null
    C --config expA/ds_config.json --set train.run_dir=runs/full --quiet --summary "$T/full/new.json" >"$T/f.out" 2>"$T/f.err"
    code $? 0 "full disk under --summary, checkpoint saved: exit 0" "$T/f.err"
    has "$T/f.err" "summary.*full/new.json.*No space left" "the failed summary write is on stderr"
    has "$T/f.err" "global_step10" "the message names the saved checkpoint"
    has "$T/f.out" '"status":"ok"' "the summary line is still on stdout"
    [ ! -e "$T/full/new.json" ] && ok "no empty summary file left" || bad "a summary file of $(wc -c <"$T/full/new.json") bytes left"
    C --config expA/ds_config.json --set train.run_dir=runs/full --resume auto --quiet --summary "$T/full/s.json" >/dev/null 2>"$T/f1.err"
    code $? 0 "full disk, an old summary there: exit 0" "$T/f1.err"
    [ "$(cat "$T/full/s.json")" = '{"old": true}' ] && ok "the old summary survives (atomic write)" \
        || bad "the old summary was destroyed: '$(cat "$T/full/s.json")'"
    rm "$T/full/fill"
    C --config expA/ds_config.json --set train.run_dir=runs/full --resume auto --quiet --summary "$T/full/s.json" >/dev/null 2>"$T/f2.err"
    code $? 0 "with space again" "$T/f2.err"
    has "$T/full/s.json" '"status":"ok"' "the summary is written"
    umount "$T/full"
else
    echo "skip full-disk --summary check: mount -t tmpfs is not permitted here"
fi

# --- --summary that is not a plain file: a link stays a link, a FIFO and a device are written
# through (renaming over them replaced the device: --summary /dev/null as root turned /dev/null
# into a regular file). Device nodes are made here (mknod), never /dev's own.
echo '{"old": true}' >"$T/target.json"
ln -s target.json "$T/link.json"
C --config expA/ds_config.json --set train.run_dir=runs/l1 --quiet --summary "$T/link.json" >/dev/null 2>"$T/l1.err"
code $? 0 "--summary through a symbolic link" "$T/l1.err"
[ -L "$T/link.json" ] && ok "the link is still a link" || bad "the link was replaced by a file"
has "$T/target.json" '"status":"ok"' "the file the link names holds the summary"
ln -s "$T/no/such/dir/x.json" "$T/dangling.json"
C --config expA/ds_config.json --set train.run_dir=runs/l0 --quiet --summary "$T/dangling.json" >/dev/null 2>"$T/l0.err"
code $? 2 "--summary through a link into a missing directory: exit 2 at start" "$T/l0.err"
untrained "$T/l0.err" "a link into a missing directory: found before training"
mkfifo "$T/fifo"
timeout 20 cat "$T/fifo" >"$T/fifo.out" &   # a reader that never gets its line gives up
C --config expA/ds_config.json --set train.run_dir=runs/l2 --quiet --summary "$T/fifo" >/dev/null 2>"$T/l2.err"
code $? 0 "--summary into a FIFO" "$T/l2.err"
wait
[ -p "$T/fifo" ] && ok "the FIFO is still a FIFO" || bad "the FIFO was replaced"
has "$T/fifo.out" '"status":"ok"' "the reader got the summary"
if mknod "$T/null" c 1 3 2>/dev/null && mknod "$T/full-dev" c 1 7 2>/dev/null; then
    C --config expA/ds_config.json --set train.run_dir=runs/l3 --quiet --summary "$T/null" >/dev/null 2>"$T/l3.err"
    code $? 0 "--summary into a null device" "$T/l3.err"
    [ -c "$T/null" ] && ok "the null device is still a device" || bad "the null device was replaced by a file"
    C --config expA/ds_config.json --set train.run_dir=runs/l4 --quiet --summary "$T/full-dev" >/dev/null 2>"$T/l4.err"
    code $? 0 "--summary into a full device, checkpoint saved: exit 0" "$T/l4.err"
    has "$T/l4.err" "full-dev.*No space left" "the failed write is on stderr"
    [ -c "$T/full-dev" ] && ok "the full device is still a device" || bad "the full device was replaced by a file"
    C export --checkpoint runs/l4/checkpoints --out "$T/full-dev" >/dev/null 2>"$T/l5.err"
    code $? 1 "export into a full device: exit 1" "$T/l5.err"
    [ -c "$T/full-dev" ] && ok "export left the device a device" || bad "export removed or replaced the device"
else
    echo "skip device --summary checks: mknod is not permitted here"
fi

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
