#!/bin/sh
# End-to-end per-rank checkpoint shards (docs/checkpoints.md, "Per-rank shards"): a ZeRO run over
# several ranks saves each rank's part of the fp32 master and optimizer state in its own file, with
# nothing gathered, and any number of ranks resumes it.
#  - 3 ranks at stage 3 write 3 shards, the index and the buffers, no model.safetensors; `ctrain info`
#    lists the shards and their ranges; their weights are the single process's (AdamW: 1e-4, as
#    e2e_dist.sh);
#  - resumes across world sizes after 10 of 20 steps: 3 -> 3 gives the uninterrupted run's weights
#    bit for bit (the same arithmetic), 3 -> 2 (stage 3 and stage 1), 2 -> 1 (one process without
#    ZeRO) and 1 -> 3 (a file set into shards) the single process's within 1e-4;
#  - `ctrain export` consolidates the shards into the tensors that an independent reader of the
#    shards (python, from shards.json and each shard's range) assembles, bit for bit, and into the
#    bytes an unsharded checkpoint of the same weights holds (model.init_from of the sharded
#    checkpoint, one step at lr 0 in one process); `ctrain eval --checkpoint` of the shards gives
#    that unsharded checkpoint's eval loss exactly;
#  - kill -9 of a random rank (or of mpirun) at a random moment of a run that saves every step (the
#    saves are most of its time), or as soon as a save's temporary directory appears: `latest` names a complete checkpoint, at or after the last one the
#    run reported saved; every directory with a COMPLETE marker verifies; `--resume auto` on 3 ranks
#    finishes with the uninterrupted run's weights bit for bit. SHARDS_KILLS=N repeats it N times (2
#    by default; docs/BENCHMARKS.md records a run of 20);
#  - a shard truncated or removed from a checkpoint: the resume exits 3 naming the file;
#  - the host memory of a save: rank 0's peak (the summary's peak_host_bytes) of a 3-rank stage-3 run
#    and of one process, with a save at the end and without any, within 10% (before the shards every
#    rank gathered the whole 12 bytes a parameter of master and Adam state to save it).
# Usage: e2e_shards.sh BUILD_DIR. Fails, naming it, when mpirun or python3 is missing (make deps
# installs them).
set -u
. test/lib_e2e.sh
BUILD=${1:-build}
B=$BUILD/ctrain
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || missing_dep "python3"
command -v mpirun >/dev/null 2>&1 || missing_dep "mpirun (Debian's openmpi-bin)"
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
[ -f "$BUILD/libctrain_mpi.so" ] || { echo "FAIL: $BUILD/libctrain_mpi.so missing (make deps, then make)"; exit 1; }
B=$(cd "$(dirname "$B")" && pwd)/ctrain
scratch_dir
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # no CMA in containers without ptrace
KILLS=${SHARDS_KILLS:-2}

random_csv "$T/train.csv" 96 32 10 11
random_csv "$T/eval.csv" 24 32 10 12
# 76,810 parameters (padded to 76,816: the parts of 3 ranks are 25,606, 25,606, 25,604, cutting
# the first layer's weight), AdamW in fp32, micro-batch 2 with accumulation, checkpoints at 10, 20
cat >"$T/c.json" <<EOF
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 5,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}},
 "model": {"input": [32], "layers": [{"type": "linear", "name": "fc1", "out": 256}, {"type": "relu"},
           {"type": "linear", "name": "fc2", "out": 256}, {"type": "relu"}, {"type": "linear", "name": "fc3", "out": 10}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}, "workers": 1},
 "zero_optimization": {"stage3_param_persistence_threshold": 0},
 "train": {"max_steps": 20, "seed": 1, "device": "cpu", "threads": 1, "save_interval": 10, "eval_interval": 0,
           "best_metric": "none"}}
EOF

# cmp.py A B TOL: safetensors files A and B hold the same tensors, each within TOL (||a - b|| / ||a||);
# TOL 0: the same bytes
cat >"$T/cmp.py" <<'EOF'
import json, math, struct, sys
from array import array
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    out = {}
    for k, v in json.loads(b[8:8 + n]).items():
        if k == "__metadata__": continue
        a, z = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], b[8 + n + a:8 + n + z])
    return out
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
if a.keys() != b.keys() or any(a[k][:2] != b[k][:2] for k in a):
    print("tensors differ:", sorted(a), sorted(b)); sys.exit(1)
if tol == 0:
    same = [k for k in a if a[k][2] == b[k][2]]
    print(f"{len(same)} of {len(a)} tensors bit for bit")
    sys.exit(0 if len(same) == len(a) else 1)
err = 0.0
for k in a:
    x, y = array("f", a[k][2]), array("f", b[k][2])
    err = max(err, math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y))) / max(math.sqrt(sum(p * p for p in x)), 1e-30))
print(f"relative error {err:.3g}")
sys.exit(0 if err <= tol else 1)
EOF
# run NAME RANKS ARGS...: train into run_dir $T/NAME on RANKS ranks (1: no mpirun)
run() {
    _r=$1 _n=$2
    shift 2
    if [ "$_n" -eq 1 ]; then set -- "$B" --config "$T/c.json" --set train.run_dir=\""$T/$_r"\" "$@"
    else set -- $MPIRUN -np "$_n" "$B" --config "$T/c.json" --set train.run_dir=\""$T/$_r"\" "$@"; fi
    if "$@" >"$T/$_r.out" 2>"$T/$_r.err"; then return 0; fi
    bad "$_r: exit $?"; tail -n 5 "$T/$_r.err"; return 1
}
# weights NAME [STEP]: the model of run NAME's checkpoint STEP (default 20) as one file (exported)
weights() {
    _s=${2:-20}
    "$B" export --checkpoint "$T/$1/checkpoints/global_step$_s" --out "$T/$1.$_s.st" >/dev/null 2>"$T/$1.export.err" ||
        cat "$T/$1.export.err" >&2
    echo "$T/$1.$_s.st"
}
# same NAME A B TOL: the final weights of runs A and B agree within TOL (0: bit for bit)
same() {
    d=$("$PY" "$T/cmp.py" "$(weights "$2")" "$(weights "$3")" "$4" 2>&1) && ok "$1 ($d)" || bad "$1: $d"
}

run one 1 && ok "one process: 20 steps"
run z3 3 --set zero_optimization.stage=3 && ok "3 ranks, stage 3: 20 steps"
run z3np2 2 --set zero_optimization.stage=3 && ok "2 ranks, stage 3: 20 steps"
S="$T/z3/checkpoints/global_step20"
ls "$S" >"$T/files"
eq "3 ranks, stage 3: the checkpoint's files" "$(tr '\n' ' ' <"$T/files")" \
    "COMPLETE buffers.safetensors config.json shards.json state.json zero_shard_0_of_3.safetensors zero_shard_1_of_3.safetensors zero_shard_2_of_3.safetensors "
"$B" info "$S" >"$T/info" 2>&1 && ok "info of a sharded checkpoint exits 0" || bad "info of a sharded checkpoint: exit $?"
has "$T/info" "checksums: match" "info: the shards' checksums match"
has "$T/info" "zero_shard_1_of_3.safetensors: \[25606, 51212)" "info: each shard's range"
has "$T/info" "fc1.weight  F32   \[256, 32\]" "info: the model's tensors from the index"
has "$T/z3.err" "saved .*global_step20" "rank 0 reports the save"
same "3 ranks, stage 3: the single process's weights" one z3 1e-4

# resumes on another number of ranks, from step 10 of 20
run z3_to_3 3 --set zero_optimization.stage=3 --resume "$T/z3/checkpoints/global_step10" &&
    same "3 -> 3 ranks: the uninterrupted run's weights" z3 z3_to_3 0
run z3_to_2 2 --set zero_optimization.stage=3 --resume "$T/z3/checkpoints/global_step10" &&
    same "3 -> 2 ranks (stage 3): the single process's weights" one z3_to_2 1e-4
run z3_to_2s1 2 --set zero_optimization.stage=1 --resume "$T/z3/checkpoints/global_step10" &&
    same "3 ranks stage 3 -> 2 ranks stage 1: the single process's weights" one z3_to_2s1 1e-4
run z2_to_1 1 --resume "$T/z3np2/checkpoints/global_step10" &&
    same "2 -> 1 (one process, no ZeRO): the single process's weights" one z2_to_1 1e-4
run one_to_3 3 --set zero_optimization.stage=3 --resume "$T/one/checkpoints/global_step10" &&
    same "1 -> 3 ranks (a file set into shards): the single process's weights" one one_to_3 1e-4
has "$T/z3_to_2.err" "resuming from .*global_step10 at step 10" "the resume says where it continues"

# export: the shards consolidated, against an independent reader of the shards
"$PY" - "$S" "$(weights z3)" <<'EOF' >"$T/py" 2>&1 && ok "export equals the shards read by python, bit for bit ($(cat "$T/py"))" || bad "export vs python's reading of the shards: $(cat "$T/py")"
import json, struct, sys
def header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
ix = json.load(open(sys.argv[1] + "/shards.json"))
flat = bytearray(4 * ix["n_params"])
for name in ix["shards"]:
    h, data = header(sys.argv[1] + "/" + name)
    d = json.loads(h["__metadata__"]["ctrain_shard"])
    a, z = h["master"]["data_offsets"]
    flat[4 * d["lo"]:4 * d["hi"]] = data[a:z]
h, data = header(sys.argv[2])
n = 0
for v in ix["views"]:
    a, z = h[v["name"]]["data_offsets"]
    numel = 1
    for s in v["shape"]: numel *= s
    assert v["trainable"], v
    assert data[a:z] == flat[4 * v["offset"]:4 * (v["offset"] + numel)], v["name"]
    n += 1
print(f"{n} tensors")
EOF
# the same weights in one file set: model.init_from the sharded checkpoint, one step at lr 0
run init 1 --set model.init_from=\""$S"\" --set optimizer.params.lr=0 --set train.max_steps=1 --set train.save_interval=1 &&
    has "$T/init.err" "init_from $S: 6 of 6 tensors loaded" "init_from a sharded checkpoint directory"
"$PY" "$T/cmp.py" "$(weights z3)" "$T/init/checkpoints/global_step1/model.safetensors" 0 >"$T/py" 2>&1 &&
    ok "export of the shards equals the unsharded checkpoint of the same weights ($(cat "$T/py"))" ||
    bad "export vs the unsharded checkpoint: $(cat "$T/py")"
"$B" eval --config "$T/c.json" --checkpoint "$S" >"$T/e1.out" 2>"$T/e1.err" || bad "eval of the shards: exit $?"
"$B" eval --config "$T/c.json" --checkpoint "$T/init/checkpoints/global_step1" >"$T/e2.out" 2>"$T/e2.err" ||
    bad "eval of the file set: exit $?"
l1=$(sed -n 's/.*"eval_loss":\([^,]*\),.*/\1/p' "$T/e1.out") l2=$(sed -n 's/.*"eval_loss":\([^,]*\),.*/\1/p' "$T/e2.out")
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok "eval --checkpoint of the shards: the file set's eval loss ($l1)" ||
    bad "eval of the shards $l1, of the file set $l2"

# kill -9 during a save: a run that saves every step, killed at a random moment
# newest_saved FILE: the step of the last "saved .../global_stepN" line in FILE (0: none)
newest_saved() { sed -n 's/^saved .*global_step\([0-9]*\) (.*/\1/p' "$1" | tail -n 1 | grep . || echo 0; }
run full 3 --set zero_optimization.stage=3 --set train.max_steps=24 --set train.save_interval=0
# any_alive PID...: status 0 when one of the processes still runs
any_alive() { for _p in "$@"; do kill -0 "$_p" 2>/dev/null && return 0; done; return 1; }
k=1
while [ $k -le "$KILLS" ]; do
    R="$T/kill$k"
    $MPIRUN -np 3 "$B" --config "$T/c.json" --set zero_optimization.stage=3 --set train.max_steps=24 \
        --set train.save_interval=1 --set train.keep_last=3 --set steps_per_print=1 \
        --set train.run_dir=\""$R"\" >"$R.out" 2>"$R.err" &
    mp=$!
    # once the first save is reported, wait 0-0.99 s more (even k), or until the temporary directory
    # of a save appears (odd k: in the middle of that save), then kill a rank (or mpirun itself)
    i=0
    while [ $i -lt 300 ] && ! grep -q '^saved ' "$R.err" 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
    if [ $((k % 2)) -eq 1 ]; then
        i=0
        while [ $i -lt 3000 ] && ! ls -a "$R/checkpoints" 2>/dev/null | grep -q '^\.tmp-'; do i=$((i + 1)); done
    else
        sleep "0.$(awk -v s="$$$k" 'BEGIN { srand(s); printf "%02d", int(rand() * 100) }')"
    fi
    ranks=$(awk -v p="$mp" '$4 == p && $2 == "(ctrain)" {print $1}' /proc/[0-9]*/stat 2>/dev/null)
    victim=$(printf '%s\n%s\n' "$mp" "$ranks" | awk -v s="$k$$" 'BEGIN { srand(s) } NF { v[n++] = $1 } END { print v[int(rand() * n)] }')
    kill -9 "$victim" 2>/dev/null
    wait "$mp" 2>/dev/null
    # mpirun killed alone leaves its ranks running: end them here too, and wait until they are gone
    # (a process in an fsync ends when the write does; rank 0's lock is released only then)
    for p in $ranks; do kill -9 "$p" 2>/dev/null; done
    i=0
    while [ $i -lt 100 ] && any_alive $ranks; do sleep 0.1; i=$((i + 1)); done
    saved=$(newest_saved "$R.err")
    tag=$(cat "$R/checkpoints/latest" 2>/dev/null)
    step=${tag#global_step}
    if [ -z "$tag" ]; then
        bad "kill $k: no latest after the first save was reported"
    elif [ "$step" -lt "$saved" ]; then
        bad "kill $k: latest is $tag, but the run reported global_step$saved saved"
    elif ! "$B" info "$R/checkpoints/$tag" >"$T/kinfo" 2>&1; then
        bad "kill $k: latest $tag does not verify: $(head -n 3 "$T/kinfo")"
    else
        # a save's temporary directory left behind: the kill came in the middle of that save
        mid=$(ls -a "$R/checkpoints" | grep -c '^\.tmp-')
        ok "kill $k ($([ "$victim" = "$mp" ] && echo mpirun || echo a rank) after save $saved$([ "$mid" -gt 0 ] &&
            echo ", in the middle of the next")): latest $tag is complete and verifies"
    fi
    for d in "$R"/checkpoints/global_step*; do
        [ -f "$d/COMPLETE" ] || continue
        "$B" info "$d" >"$T/kinfo" 2>&1 || bad "kill $k: $d has a COMPLETE marker but does not verify: $(head -n 2 "$T/kinfo")"
    done
    if $MPIRUN -np 3 "$B" --config "$T/c.json" --set zero_optimization.stage=3 --set train.max_steps=24 \
        --set train.save_interval=1 --set train.keep_last=3 --set train.run_dir=\""$R"\" --resume auto \
        >"$R.resume.out" 2>"$R.resume.err"; then
        has "$R.resume.err" "resuming from .*/$tag at step $step" "kill $k: --resume auto continues from $tag"
        d=$("$PY" "$T/cmp.py" "$(weights full 24)" "$(weights "kill$k" 24)" 0 2>&1) &&
            ok "kill $k: --resume auto finishes with the uninterrupted run's weights ($d)" || bad "kill $k: weights differ: $d"
    else
        bad "kill $k: --resume auto exit $?"; grep -m 3 "error" "$R.resume.err"
    fi
    k=$((k + 1))
done

# a damaged shard: truncated, or gone; the resume refuses it (exit 3) naming the file
cp -r "$T/z3" "$T/dmg"
truncate -s -4 "$T/dmg/checkpoints/global_step10/zero_shard_2_of_3.safetensors"
$MPIRUN -np 2 "$B" --config "$T/c.json" --set zero_optimization.stage=3 --resume "$T/dmg/checkpoints/global_step10" \
    --set train.run_dir=\""$T/dmg2"\" >"$T/out" 2>"$T/err"
eq "a truncated shard: the resume on 2 ranks exits 3" "$?" 3
has "$T/err" "zero_shard_2_of_3.safetensors: .*truncated" "the refusal names the truncated shard"
rm "$T/dmg/checkpoints/global_step20/zero_shard_0_of_3.safetensors"
"$B" --config "$T/c.json" --resume "$T/dmg/checkpoints/global_step20" --set train.run_dir=\""$T/dmg3"\" >"$T/out" 2>"$T/err"
eq "a missing shard: the resume exits 3" "$?" 3
has "$T/err" "zero_shard_0_of_3.safetensors: missing" "the refusal names the missing shard"

# no train.run_dir: rank 0 makes the one run directory (runs/<name>/<time>) and every rank writes its
# shard into it; --resume auto on 2 ranks continues it (before, each rank made a directory of its own
# and rank 1's shard went into a path rank 0 never made: the save failed)
mkdir -p "$T/nodir" && cp "$T/c.json" "$T/nodir/c.json"
(cd "$T/nodir" && ln -sf ../train.csv train.csv && ln -sf ../eval.csv eval.csv &&
 $MPIRUN -np 2 "$B" --config c.json --set zero_optimization.stage=2 train.max_steps=10 >out 2>err)
eq "no run_dir, 2 ranks: exit" "$?" 0
n=$(find "$T/nodir/runs/c" -mindepth 1 -maxdepth 1 -type d | wc -l)
eq "no run_dir, 2 ranks: one run directory" "$n" 1
[ -f "$T/nodir/runs/c/latest/checkpoints/global_step10/zero_shard_1_of_2.safetensors" ] &&
    ok "rank 1's shard is in rank 0's run directory" || bad "rank 1's shard is not in runs/c/latest/checkpoints/global_step10"
(cd "$T/nodir" && $MPIRUN -np 2 "$B" --config c.json --resume auto --set zero_optimization.stage=2 train.max_steps=20 >out2 2>err2)
eq "no run_dir, 2 ranks, --resume auto: exit" "$?" 0
has "$T/nodir/err2" "resuming from runs/c/" "the resume continues rank 0's run directory"

# host memory at a save: rank 0's peak with a save at the end against the same run without one.
# 1.1 M parameters (13 MB of master and Adam state), so that a whole-state copy would show.
cat >"$T/big.json" <<EOF
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 4,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "model": {"input": [32], "layers": [{"type": "linear", "out": 1024}, {"type": "relu"}, {"type": "linear", "out": 1024},
           {"type": "relu"}, {"type": "linear", "out": 10}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "workers": 1},
 "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
 "train": {"max_steps": 3, "seed": 1, "device": "cpu", "threads": 1, "save_interval": 3}}
EOF
peak() { sed -n 's/.*"peak_host_bytes":\([0-9]*\).*/\1/p' "$1"; }
for n in 3 1; do
    for s in save nosave; do
        set -- --config "$T/big.json" --set train.run_dir=\""$T/big$n$s"\"
        [ $s = nosave ] && set -- "$@" --set checkpoint.enabled=false
        if [ $n -eq 1 ]; then "$B" "$@" >"$T/big$n$s.out" 2>"$T/big$n$s.err"
        else $MPIRUN -np $n "$B" "$@" >"$T/big$n$s.out" 2>"$T/big$n$s.err"; fi || { bad "big, $n ranks, $s: exit $?"; tail -3 "$T/big$n$s.err"; }
    done
    a=$(peak "$T/big${n}save.out") b=$(peak "$T/big${n}nosave.out")
    [ -n "$a" ] && [ -n "$b" ] && [ $((a * 100)) -le $((b * 110)) ] &&
        ok "$n rank(s): peak host bytes with a save $a, without $b (within 10%)" ||
        bad "$n rank(s): peak host bytes with a save ${a:-?}, without ${b:-?} (more than 10% apart)"
done

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
