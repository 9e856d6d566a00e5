#!/bin/sh
# End-to-end data parallelism on the CPU (MPI; docs/distributed.md):
#  - `mpirun -np N ctrain` gives the weights of one process after 20 steps: ZeRO stage 0 on N = 1, 2,
#    3, 4 for both configs, stages 1 and 2 on 2, 3, 4 ranks (each config at least once). Configs:
#    SGD with momentum in fp32, AdamW in fp16 (dynamic loss scale from 2^24, so the first steps
#    overflow: 5 of them are skipped, and every rank must skip the same); both with gradient accumulation
#    (micro-batch 2: each rank accumulates 12/N micro-batches), 119 parameters (divisible by none of
#    2, 3, 4; 128 elements with padding, so the ZeRO parts of 3 ranks are 43, 43, 42), and a short
#    last step of each epoch (drop_last false: 300 samples in steps of 24 leave 12, of which ranks 2
#    and 3 of 4 get nothing). The summary's train_loss, loss scale and skipped steps equal the single
#    process's: losses are averaged over the global batch.
#    Tolerances: SGD 1e-5 relative (the issue's bound; the ranks only add the same per-sample
#    gradients in another order, ~1e-7 measured). AdamW 1e-4: its update m / (sqrt(v) + eps) divides
#    two running sums of those gradients, so a rounding difference in a tiny gradient element can
#    move its update by up to lr, not by lr times the rounding; over 20 steps at lr 0.01 that
#    stays far below 1e-4 of the weights' norm (~1e-7 measured), while a rank that missed or
#    doubled a micro-batch moves them by more than 1e-3.
#  - overlap_comm gives the same weights bit for bit as without: stages 0 and 2, fp32 and fp16, 2 and
#    3 ranks; stage 3 (overlap and prefetch by default) against no overlap and no prefetch, also on
#    the language model (recompute passes, a tied head, evaluation);
#  - fp32 with the gradient norm only on the steps whose line shows it (ZeRO 2, 2 ranks): the ranks
#    agree on those steps (the sum of squares is all-reduced) and train as the single process;
#  - per-rank bytes at stage 1 (measured peaks of rank 0) are its part of master and optimizer state;
#  - a checkpoint saved by 4 ranks at stage 1 resumes on 2 ranks and on 1 process with the weights of
#    the uninterrupted run;
#  - only rank 0 prints the start block and the summary, and writes the run directory;
#  - a rank killed with SIGKILL ends the run of every rank within 30 s;
#  - the torchrun-style launch without mpirun (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT; the ranks
#    meet over a TCP rendezvous): 2, 3 and 4 ranks at stages 0, 3 and 1 give the single process's
#    weights, and so does torchrun itself (python3-torch's, when installed) at stage 2; a rank killed
#    ends the other within the collective timeout, and no ompi-server outlives the job; a rank stuck
#    inside MPI itself (test/hang_testall.c, preloaded: MPI_Testall never returns) is ended by its
#    watchdog within the timeout, and a SIGTERM to it ends it with 143 and a line saying why;
#  - ranks started alike or not at all: another ZeRO stage, model width, lr, data limit or data
#    content on one rank stops every rank with exit 2 naming the ranks and the first key that
#    differs; two processes with one RANK (1 twice, 0 twice) end with exit 2 naming both; a process
#    with mpirun's variables set by hand is refused; a config asking for pipeline parallelism is
#    refused under mpirun -np 2 (docs/config.md, "Another kind of training");
#  - the environment launch's errors: WORLD_SIZE=abc, RANK >= WORLD_SIZE, a bad MASTER_PORT, RANK or
#    MASTER_ADDR missing are config errors (exit 2) naming the variable; a rank whose peers never come
#    ends after the timeout (exit 1) saying whom it waited for; --world-size 2 without a launcher is
#    refused naming mpirun; stage 3 with train.sample_every (the sampler reads whole parameters) is
#    refused.
# Usage: e2e_dist.sh BUILD_DIR. Fails, naming it, when mpirun is not installed (make deps installs it).
set -u
BUILD=${1:-build}
B=$BUILD/ctrain
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
# what make deps installs is never a reason to skip: missing, the test fails naming it
[ -n "$PY" ] || { echo "FAIL missing dependency: python3 (Debian's python3); make deps installs it"; exit 1; }
command -v mpirun >/dev/null 2>&1 || { echo "FAIL missing dependency: mpirun (Debian's openmpi-bin); make deps installs it"; exit 1; }
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
[ -f "$BUILD/libctrain_mpi.so" ] || { echo "FAIL: $BUILD/libctrain_mpi.so missing (make with OpenMPI's headers: make deps)"; exit 1; }
. test/lib_e2e.sh
scratch_dir
# root in containers; more ranks than the 2 cores here
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
export OMPI_MCA_btl_vader_single_copy_mechanism=none   # no CMA in containers without ptrace

random_csv "$T/train.csv" 300 13 5 7
# cfg NAME OPTIMIZER FP16 BUCKET: a config of 20 steps of 24 samples, micro-batch 2, a checkpoint at the end
cfg() {
    cat >"$T/$1.json" <<EOF
{"train_batch_size": 24, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "optimizer": $2, "fp16": {"enabled": $3, "initial_scale_power": 24},
 "model": {"input": [13], "layers": [{"type": "linear", "name": "fc1", "out": 6}, {"type": "tanh", "name": "t"},
           {"type": "linear", "name": "fc2", "out": 5}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "workers": 1, "drop_last": false},
 "zero_optimization": {"reduce_bucket_size": $4, "stage3_param_persistence_threshold": 0},
 "train": {"max_steps": 20, "seed": 3, "device": "cpu", "threads": 1, "save_interval": 20}}
EOF
}
cfg sgd '{"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}' false 50   # 3 buckets of gradients
cfg adam '{"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}' true 500000000

# weights RUN: the model of run RUN's final checkpoint as one file: its model.safetensors, or for
# per-rank shards (ZeRO stages 1-3 on several ranks) their consolidation by `ctrain export`
weights() {
    _d="$T/$1/checkpoints/global_step20"
    if [ -f "$_d/model.safetensors" ]; then echo "$_d/model.safetensors"; return; fi
    "$B" export --checkpoint "$_d" --out "$T/$1.weights.safetensors" >/dev/null 2>"$T/$1.export.err" &&
        echo "$T/$1.weights.safetensors"
}
# close A B TOL: the final checkpoints of runs A and B hold the same weights within TOL (the largest
# relative error of a tensor, ||a - b|| / ||a||)
close() {
    "$PY" - "$(weights "$1")" "$(weights "$2")" "$3" <<'EOF'
import json, math, struct, sys
from array import array
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    out = {}
    for k, v in json.loads(b[8:8 + n]).items():
        if k == "__metadata__": continue
        assert v["dtype"] == "F32", v["dtype"]
        a, z = v["data_offsets"]
        out[k] = array("f", b[8 + n + a:8 + n + z])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
err = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k], b[k]))) / max(math.sqrt(sum(x * x for x in a[k])), 1e-30) for k in a)
print(f"relative error {err:.3g}")
sys.exit(0 if err <= float(sys.argv[3]) else 1)
EOF
}
# same_summary A B: train_loss within 1e-6 relative, and the same loss scale and skipped steps
same_summary() {
    "$PY" -c "
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
ok = abs(a['train_loss'] - b['train_loss']) <= 1e-6 * abs(a['train_loss']) and a['loss_scale'] == b['loss_scale'] \
     and (a['loss_scale'] is None or a['skipped_steps'] > 0) \
     and a['skipped_steps'] == b['skipped_steps'] and a['steps'] == b['steps'] == 20
print(a['train_loss'], b['train_loss'], a['loss_scale'], b['loss_scale'], a['skipped_steps'], b['skipped_steps'])
sys.exit(0 if ok else 1)" "$T/$1.out" "$T/$2.out"
}

# The launchers `ranks` uses ($LAUNCH): LAUNCHER N CMD... runs N ranks of CMD.
mpi_launch() { _n=$1; shift; $MPIRUN -np "$_n" "$@"; }
# torchrun's variables, no mpirun: N processes started highest rank first (rank 0 last, so the others
# wait for it), a fresh MASTER_PORT each time; the exit status is the last failure's
PORT=$((20000 + $$ % 20000))
env_launch() {
    _n=$1; shift
    PORT=$(free_port)
    _r=$((_n - 1)) _pids="" _rc=0
    while [ $_r -ge 0 ]; do
        WORLD_SIZE=$_n RANK=$_r LOCAL_RANK=$_r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$@" &
        _pids="$_pids $!" _r=$((_r - 1))
    done
    for _p in $_pids; do wait "$_p" || _rc=$?; done
    return $_rc
}
# torchrun itself (Debian's python3-torch), through test/torchrun.py
torchrun_launch() { _n=$1; shift; PORT=$(free_port); "$PY" test/torchrun.py --nproc_per_node "$_n" --master_port "$PORT" --no_python "$@"; }
LAUNCH=mpi_launch

# ranks NAME CONFIG N STAGE [ARGS...]: N ranks ($LAUNCH) with zero_optimization.stage STAGE into
# run_dir $T/NAME; its weights, summary and output against the single process's (NAME of CONFIG1)
ranks() {
    r=$1 c=$2 n=$3 st=$4
    shift 4
    tol=1e-5
    [ "$c" = adam ] && tol=1e-4
    if $LAUNCH "$n" "$B" --config "$T/$c.json" --set zero_optimization.stage="$st" \
        --set train.run_dir=\""$T/$r"\" "$@" >"$T/$r.out" 2>"$T/$r.err"; then
        ok "$r: $LAUNCH $n, stage $st exits 0"
    else
        bad "$r: $LAUNCH $n, stage $st (exit $?)"; head -n 4 "$T/$r.err"; echo "     ..."; tail -n 5 "$T/$r.err"; return
    fi
    d=$(close "${c}1" "$r" $tol) && ok "$r: the single process's weights ($d, at most $tol)" || bad "$r: weights differ: $d"
    case "$*" in *--resume*) return ;; esac   # a resumed run: the weights are what counts
    s=$(same_summary "${c}1" "$r") && ok "$r: same train_loss, loss scale, skipped steps" || bad "$r: summary differs: $s"
    [ "$(grep -c '^ctrain ' "$T/$r.err")" -eq 1 ] && ok "$r: one start block (rank 0's)" ||
        bad "$r: $(grep -c '^ctrain ' "$T/$r.err") start blocks"
    [ "$(grep -c '^{"status"' "$T/$r.out")" -eq 1 ] && ok "$r: one summary line" ||
        bad "$r: $(grep -c '^{"status"' "$T/$r.out") summary lines"
}
for c in sgd adam; do
    "$B" --config "$T/$c.json" --set train.run_dir=\""$T/${c}1"\" >"$T/${c}1.out" 2>"$T/${c}1.err" ||
        { bad "$c: the single process (exit $?)"; tail -3 "$T/${c}1.err"; }
done
# ZeRO stage 0 on 1-4 ranks, both configs; stages 1 and 2 on 2-4 ranks, each config at least once
for n in 1 2 3 4; do ranks sgd_np$n sgd $n 0; ranks adam_np$n adam $n 0; done
ranks sgd_z1_np2 sgd 2 1
ranks sgd_z1_np3 sgd 3 1
ranks adam_z1_np4 adam 4 1
ranks adam_z2_np2 adam 2 2
ranks sgd_z2_np3 sgd 3 2
ranks sgd_z2_np4 sgd 4 2
# stage 3 (parameters gathered layer by layer, gradients reduce-scattered per layer and micro-batch):
# every view gathered (threshold 0) on 2-4 ranks, both configs; with the biases (6 and 5 elements)
# kept whole on every rank (threshold 8); one process (stage 3 trains as stage 0)
ranks sgd_z3_np1 sgd 1 3
ranks sgd_z3_np2 sgd 2 3
ranks sgd_z3_np3 sgd 3 3
ranks sgd_z3_np4 sgd 4 3
ranks adam_z3_np2 adam 2 3
ranks adam_z3_np3 adam 3 3
ranks adam_z3_np4 adam 4 3
ranks sgd_z3_np3_persist sgd 3 3 --set zero_optimization.stage3_param_persistence_threshold=8
ranks adam_z3_np4_persist adam 4 3 --set zero_optimization.stage3_param_persistence_threshold=8
# offload on the CPU backend: the optimizer state and parameters are in host memory already, so
# offload_optimizer (stages 1-3) and offload_param (stage 3) move nothing and train bit for bit as
# without; each run says so
# offload NAME BASE CONFIG N STAGE ARGS...: ranks NAME ..., whose weights must be BASE's exactly
offload() {
    r=$1 base=$2
    shift 2
    ranks "$r" "$@"
    d=$(close "$base" "$r" 0) && ok "$r: offload trains as $base, bit for bit" || bad "$r: differs from $base: $d"
    has "$T/$r.err" "offload_[a-z]*.device cpu: .*on the CPU backend that is host memory already: nothing moves" \
        "$r: says that nothing moves"
}
offload sgd_z1_np3_off sgd_z1_np3 sgd 3 1 --set zero_optimization.offload_optimizer.device=\"cpu\"
offload adam_z2_np2_off adam_z2_np2 adam 2 2 --set zero_optimization.offload_optimizer.device=\"cpu\"
offload adam_z3_np4_off adam_z3_np4 adam 4 3 --set zero_optimization.offload_optimizer.device=\"cpu\" \
    --set zero_optimization.offload_param.device=\"cpu\"
# overlap_comm: the gradient reduction of stages 0-2 starts during backward (stage 0: a bucket as soon
# as its last layer's backward is done; stage 2: a layer's reduce-scatter while the layer below
# computes), and stage 3 prefetches the next layers' gathers; the same non-blocking collectives as
# without, so the same weights bit for bit: stages 0 and 2, fp32 (3 buckets at stage 0) and fp16,
# 2 and 3 ranks, against the same runs with overlap_comm false (stage 3's default is true, with
# prefetch and reuse: its runs above against overlap_comm false, stage3_prefetch_bucket_size 0 and
# stage3_max_reuse_distance 0)
# same_bits NAME BASE CONFIG N STAGE ARGS...: ranks NAME ..., whose weights must be BASE's exactly
same_bits() {
    r=$1 base=$2
    shift 2
    ranks "$r" "$@"
    d=$(close "$base" "$r" 0) && ok "$r: the weights of $base, bit for bit" || bad "$r: differs from $base: $d"
}
ranks sgd_z2_np2 sgd 2 2
ranks adam_z2_np3 adam 3 2
for n in 2 3; do
    same_bits sgd_np${n}_ov sgd_np$n sgd $n 0 --set zero_optimization.overlap_comm=true
    same_bits adam_np${n}_ov adam_np$n adam $n 0 --set zero_optimization.overlap_comm=true
    same_bits sgd_z2_np${n}_ov sgd_z2_np$n sgd $n 2 --set zero_optimization.overlap_comm=true
    same_bits adam_z2_np${n}_ov adam_z2_np$n adam $n 2 --set zero_optimization.overlap_comm=true
done
# stage 1's all-gather of the updated compute copy in calls of allgather_bucket_size elements: copies
same_bits sgd_z1_np3_ag sgd_z1_np3 sgd 3 1 --set zero_optimization.allgather_bucket_size=20
same_bits adam_z2_np2_ag adam_z2_np2 adam 2 2 --set zero_optimization.allgather_bucket_size=30
same_bits sgd_z3_np3_noov sgd_z3_np3 sgd 3 3 --set zero_optimization.overlap_comm=false \
    --set zero_optimization.stage3_prefetch_bucket_size=0 --set zero_optimization.stage3_max_reuse_distance=0
same_bits adam_z3_np2_noov adam_z3_np2 adam 2 3 --set zero_optimization.overlap_comm=false \
    --set zero_optimization.stage3_prefetch_bucket_size=0 --set zero_optimization.stage3_max_reuse_distance=0
# fp32 without clipping computes the global norm only for the step lines that show it (every 3rd
# step here): under ZeRO its sum of squares is all-reduced, so every rank must make that choice alike
ranks sgd_z2_np2_p3 sgd 2 2 --set steps_per_print=3
eq "ZeRO 2, norm on every 3rd step: a number as grad-norm on each of 6 step lines" \
    "$(grep -c '^step .*grad-norm [0-9]' "$T/sgd_z2_np2_p3.err")" 6
# stage 3 on a small language model: a head tied to the token embedding (one view, gathered by both
# layers, its gradient reduced from both), activation checkpointing (each segment's layers gathered
# again for the recompute), an eval set (forward with the gathers), gradient clipping (the norm over
# the ranks' parts), layer norms and biases below the persistence threshold kept whole: 3 ranks,
# the single process's weights, losses and eval numbers
if [ -f /usr/share/common-licenses/GPL-3 ]; then
    sh datasets/text_tokens.sh --ctrain "$B" "$T" /usr/share/common-licenses/* >"$T/log" 2>&1 || cat "$T/log"
    cat >"$T/lm.json" <<EOF
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 5,
 "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, "gradient_clipping": 1.0,
 "activation_checkpointing": {"number_checkpoints": 2},
 "model": {"input": [16], "layers": [{"type": "embedding", "name": "wte", "vocab": 256, "dim": 16},
   {"type": "position_embedding", "name": "wpe", "max_len": 16},
   {"type": "repeat", "times": 2, "layers": [{"type": "transformer_block", "heads": 2}]},
   {"type": "layernorm", "name": "ln_f"}, {"type": "linear", "name": "head", "out": 256, "bias": false, "tie": "wte.weight"}],
   "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "tokens", "path": "train.bin", "seq_len": 16},
          "eval": {"format": "tokens", "path": "eval.bin", "seq_len": 16, "limit": 40}, "workers": 1},
 "zero_optimization": {"stage3_param_persistence_threshold": 100},
 "train": {"max_steps": 20, "eval_interval": 10, "seed": 5, "device": "cpu", "threads": 1, "save_interval": 20}}
EOF
    "$B" --config "$T/lm.json" --set train.run_dir=\""$T/lm1"\" >"$T/lm1.out" 2>"$T/lm1.err" ||
        { bad "lm: the single process (exit $?)"; tail -3 "$T/lm1.err"; }
    ranks lm_z3_np3 lm 3 3
    # the prefetch and the reuse follow the recompute passes, the tied head and evaluation: the same
    # bits without them
    same_bits lm_z3_np3_nopf lm_z3_np3 lm 3 3 --set zero_optimization.stage3_prefetch_bucket_size=0 \
        --set zero_optimization.stage3_max_reuse_distance=0
    "$PY" -c "
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
print(a['eval_loss'], b['eval_loss'])
sys.exit(0 if abs(a['eval_loss'] - b['eval_loss']) <= 1e-5 * a['eval_loss'] and a['eval_accuracy'] == b['eval_accuracy'] else 1)" \
        "$T/lm1.out" "$T/lm_z3_np3.out" >"$T/cmp" 2>&1 && ok "lm, stage 3: the single process's eval loss and accuracy" ||
        bad "lm, stage 3: eval differs: $(cat "$T/cmp")"
else
    echo "skip: stage 3 on a language model (no /usr/share/common-licenses)"
fi
has "$T/sgd_np3.err" "world 3" "the batch line names the world size"
has "$T/sgd_np3.err" "· 3 ranks" "the first line names the ranks"
has "$T/sgd_z2_np4.err" "ZeRO stage 2" "the first line names the ZeRO stage"
has "$T/sgd_z3_np4.err" "ZeRO stage 3 (fp32 master, optimizer state, gradients and parameters partitioned: 1/4 per rank" \
    "the first line names ZeRO stage 3 and what it splits"
has "$T/sgd_z1_np3.err" "memory plan: params 512 B, master 176 B, grads 512 B, optimizer 192 B.* per rank" \
    "the start block plans rank 0's part"

# per-rank bytes, measured (the summary's peaks, rank 0's): the model's space is 128 elements with
# the views' padding; stage 1 on 3 ranks gives rank 0 ceil(128 / 3) = 43 of them in the fp32 master
# (+ 1 float of buffers in that category) and the momentum (kept in multiples of 16: 48), the
# gradients and the fp32 copy forward reads whole; one process has 128 of each
"$PY" -c "
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1])['peak_bytes_by_category'] for f in sys.argv[1:3])
print(a, b)
ok = a['optim'] == 512 and a['master'] == 516 and b['optim'] == 48 * 4 and b['master'] == 43 * 4 + 4 \
     and b['grads'] == a['grads'] == 512 and b['params'] == 512
sys.exit(0 if ok else 1)" "$T/sgd1.out" "$T/sgd_z1_np3.out" >"$T/bytes" 2>&1 &&
    ok "stage 1, 3 ranks: rank 0 holds 43 of 128 elements of master and momentum (measured)" ||
    bad "stage 1, 3 ranks: per-rank bytes $(cat "$T/bytes")"

# per-rank bytes against ZeRO's formulas (the ZeRO paper, section 5; DeepSpeed's docs): with Ψ
# parameters, N ranks and mixed precision with Adam, a rank holds K = 12 bytes per parameter of
# fp32 master and optimizer state /N from stage 1 on, gradients /N from stage 2 on, 16-bit
# parameters /N at stage 3 (stage 1: 2Ψ + 2Ψ + 12Ψ/N; 2: 2Ψ + 14Ψ/N; 3: 16Ψ/N). ctrain's
# gradients are fp32 (4 bytes where the formulas count 2), so its gradients are held against 4Ψ
# and 4Ψ/N. Measured on rank 0 (the summary's peaks: its part is the largest) of 4 ranks, fp16 AdamW,
# an MLP of 76,810 parameters (every view partitioned: persistence threshold 0), within 5%; the
# partition's scratch (one layer's gathered parameters and gradients) is workspace, as DeepSpeed's
# buckets are outside its formulas. The start block's plan must be what was measured.
random_csv "$T/wide.csv" 64 32 10 11
cat >"$T/wide.json" <<EOF
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}, "fp16": {"enabled": true},
 "model": {"input": [32], "layers": [{"type": "linear", "out": 256}, {"type": "relu"}, {"type": "linear", "out": 256},
           {"type": "relu"}, {"type": "linear", "out": 10}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "wide.csv"}, "workers": 1},
 "zero_optimization": {"stage3_param_persistence_threshold": 0},
 "train": {"max_steps": 2, "seed": 1, "device": "cpu", "threads": 1, "save_interval": 0}}
EOF
for st in 0 1 2 3; do
    $MPIRUN -np 4 "$B" --config "$T/wide.json" --set zero_optimization.stage=$st --set train.run_dir=\""$T/wide$st"\" \
        >"$T/wide$st.out" 2>"$T/wide$st.err" || { bad "bytes run, stage $st (exit $?)"; tail -3 "$T/wide$st.err"; }
    "$PY" - "$T/wide$st.out" $st <<'EOF' >"$T/bytes" 2>&1 && ok "stage $st, 4 ranks: per-rank bytes as ZeRO's formulas ($(cat "$T/bytes"))" || bad "stage $st, 4 ranks: per-rank bytes: $(cat "$T/bytes")"
import json, sys
summary = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
b, plan = summary["peak_bytes_by_category"], summary["planned_bytes_by_category"]
stage, P, N = int(sys.argv[2]), 76810, 4
planned = all(b[k] == plan[k] for k in ("params", "master", "grads", "optim"))
if not planned: print("measured", b, "planned", plan)
want = {"master+optim": 12 * P / (N if stage >= 1 else 1), "grads": 4 * P / (N if stage >= 2 else 1),
        "params": 2 * P / (N if stage >= 3 else 1)}
got = {"master+optim": b["master"] + b["optim"], "grads": b["grads"], "params": b["params"]}
print(", ".join(f"{k} {got[k]} B = {got[k] / want[k]:.3f} x {want[k]:.0f}" for k in want))
sys.exit(0 if planned and all(abs(got[k] / want[k] - 1) <= 0.05 for k in want) else 1)
EOF
done

# a checkpoint saved by 4 ranks at stage 1 (after 10 steps) resumes on 2 ranks and on 1 process:
# the same weights after 20 steps as the run that was not interrupted
$MPIRUN -np 4 "$B" --config "$T/sgd.json" --set zero_optimization.stage=1 --set train.max_steps=10 \
    --set train.run_dir=\""$T/half"\" >"$T/half.out" 2>"$T/half.err" && ok "4 ranks, stage 1: 10 steps saved" ||
    { bad "4 ranks, stage 1: 10 steps (exit $?)"; tail -5 "$T/half.err"; }
ranks resume_np2 sgd 2 1 --resume "$T/half/checkpoints/global_step10"
"$B" --config "$T/sgd.json" --resume "$T/half/checkpoints/global_step10" --set train.run_dir=\""$T/resume_np1"\" \
    >"$T/resume_np1.out" 2>"$T/resume_np1.err" || { bad "resume on 1 process (exit $?)"; tail -3 "$T/resume_np1.err"; }
d=$(close sgd1 resume_np1 1e-5) && ok "4 ranks' checkpoint resumed by 1 process: the same weights ($d)" ||
    bad "4 ranks' checkpoint resumed by 1 process: $d"
# the same at stage 3: 4 ranks' checkpoint after 10 steps, resumed at stage 3 on 2 ranks and by 1 process
$MPIRUN -np 4 "$B" --config "$T/sgd.json" --set zero_optimization.stage=3 --set train.max_steps=10 \
    --set train.run_dir=\""$T/half3"\" >"$T/half3.out" 2>"$T/half3.err" && ok "4 ranks, stage 3: 10 steps saved" ||
    { bad "4 ranks, stage 3: 10 steps (exit $?)"; tail -5 "$T/half3.err"; }
ranks resume3_np2 sgd 2 3 --resume "$T/half3/checkpoints/global_step10"
"$B" --config "$T/sgd.json" --resume "$T/half3/checkpoints/global_step10" --set train.run_dir=\""$T/resume3_np1"\" \
    >"$T/resume3_np1.out" 2>"$T/resume3_np1.err" || { bad "resume stage 3 on 1 process (exit $?)"; tail -3 "$T/resume3_np1.err"; }
d=$(close sgd1 resume3_np1 1e-5) && ok "4 ranks' stage-3 checkpoint resumed by 1 process: the same weights ($d)" ||
    bad "4 ranks' stage-3 checkpoint resumed by 1 process: $d"

# started FILE: waits up to 20 s for a run's first progress line in FILE (training has begun)
started() {
    _i=0
    while [ $_i -lt 200 ] && ! grep -q '^step ' "$1" 2>/dev/null; do sleep 0.1; _i=$((_i + 1)); done
}
# ends_within PID TENTHS: waits until process PID has ended, at most TENTHS tenths of a second;
# status 0 when it ended
ends_within() {
    _i=0
    while [ $_i -lt "$2" ] && kill -0 "$1" 2>/dev/null; do sleep 0.1; _i=$((_i + 1)); done
    ! kill -0 "$1" 2>/dev/null
}

# a rank killed in the middle of training ends the others (mpirun notices; a rank never waits
# forever in a collective): within 30 s, ~2 s measured
$MPIRUN -np 2 "$B" --config "$T/sgd.json" --set train.max_steps=100000000 --set train.save_interval=0 \
    --set train.run_dir=\""$T/kill"\" >"$T/kill.out" 2>"$T/kill.err" &
mp=$!
started "$T/kill.err"
# a ctrain child of mpirun, from /proc (pid (comm) state ppid ...)
victim=$(awk -v p="$mp" '$4 == p && $2 == "(ctrain)" {print $1}' /proc/[0-9]*/stat 2>/dev/null | tail -n 1)
if [ -n "$victim" ]; then
    kill -9 "$victim"
    t0=$(date +%s)
    if ! ends_within "$mp" 300; then
        bad "one rank killed: mpirun still running after 30 s"; kill "$mp"
    else
        ok "one rank killed: every rank ended within $(( $(date +%s) - t0 + 1 )) s"
    fi
else
    bad "no rank process of mpirun $mp found"; tail -n 3 "$T/kill.err"; kill "$mp"
fi
wait "$mp" 2>/dev/null

# a rank that stops answering (SIGSTOP: alive, but in no collective) ends the job within the
# collective timeout: the others' watchdog exits naming CTRAIN_COMM_TIMEOUT (3 s here), mpirun ends
# the rest; the stopped rank, continued, finds its peers gone and ends too
CTRAIN_COMM_TIMEOUT=3 $MPIRUN -np 2 "$B" --config "$T/sgd.json" --set train.max_steps=100000000 \
    --set train.save_interval=0 --set train.run_dir=\""$T/hang"\" >"$T/hang.out" 2>"$T/hang.err" &
mp=$!
started "$T/hang.err"
victim=$(awk -v p="$mp" '$4 == p && $2 == "(ctrain)" {print $1}' /proc/[0-9]*/stat 2>/dev/null | tail -n 1)
if [ -n "$victim" ]; then
    kill -STOP "$victim"
    t0=$(date +%s)
    if ! ends_within "$mp" 300; then
        bad "one rank stopped: mpirun still running after 30 s"; kill "$mp"
    else
        ok "one rank stopped: the job ended within $(( $(date +%s) - t0 + 1 )) s (timeout 3 s)"
    fi
    has "$T/hang.err" "rank [01] of 2: MPI .* has waited [0-9]* s for the other ranks (CTRAIN_COMM_TIMEOUT=3)" \
        "the message names the waiting rank, the collective and CTRAIN_COMM_TIMEOUT"
    kill -CONT "$victim" 2>/dev/null
    if ! ends_within "$victim" 100; then bad "the stopped rank, continued, is still running"; kill -9 "$victim"
    else ok "the stopped rank, continued, ended too"; fi
else
    bad "no rank process of mpirun $mp found"; tail -n 3 "$T/hang.err"; kill "$mp"
fi
wait "$mp" 2>/dev/null

# --- the torchrun-style launch without mpirun: the ranks meet over a TCP rendezvous on
# MASTER_ADDR:MASTER_PORT and become one MPI communicator (through an ompi-server rank 0 starts)
LAUNCH=env_launch
ranks env_sgd_np2 sgd 2 0
ranks env_adam_z3_np3 adam 3 3
ranks env_sgd_z1_np4 sgd 4 1
if "$PY" -c "import torch.distributed.run" 2>/dev/null; then
    # torchrun's own agent holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True): ctrain meets on the next
    LAUNCH=torchrun_launch
    ranks torchrun_adam_z2_np2 adam 2 2
else
    echo "skip: torchrun (python3-torch) not installed"
fi
LAUNCH=mpi_launch

# a rank killed in the middle of an environment launch ends the other within the collective timeout
# (no mpirun to end it: its watchdog does)
PORT=$(free_port)
for rank in 1 0; do
    TMPDIR="$T" CTRAIN_COMM_TIMEOUT=3 WORLD_SIZE=2 RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$B" --config "$T/sgd.json" \
        --set train.max_steps=100000000 --set train.save_interval=0 --set train.run_dir=\""$T/envkill"\" \
        >"$T/envkill$rank.out" 2>"$T/envkill$rank.err" &
    [ $rank -eq 1 ] && victim=$! || survivor=$!
done
started "$T/envkill0.err"
kill -9 "$victim"
t0=$(date +%s)
if ! ends_within "$survivor" 300; then
    bad "environment launch, one rank killed: rank 0 still running after 30 s"; kill -9 "$survivor"
else
    ok "environment launch, one rank killed: rank 0 ended within $(( $(date +%s) - t0 + 1 )) s (timeout 3 s)"
fi
wait "$survivor" 2>/dev/null
has "$T/envkill0.err" "rank 0 of 2: MPI .* has waited [0-9]* s for the other ranks (CTRAIN_COMM_TIMEOUT=3)" \
    "environment launch, one rank killed: rank 0's message names the collective and CTRAIN_COMM_TIMEOUT"

# a rank stuck inside MPI itself: test/hang_testall.c, preloaded into rank 1 only, makes its
# MPI_Testall never return after 100 calls (as one hung after a peer died, 1 kill in 15, before every
# wait was under the watchdog). stuck NAME SIGNAL TIMEOUT1: rank 0 (timeout 2 s) ends on its own
# watchdog once rank 1 stops answering; then rank 1 (timeout TIMEOUT1) gets SIGNAL (or none) and
# must end within its timeout and its polled wait's 2 s of slack: exit 1 without a signal, 128 + it
# with one, and a line saying why.
mpicc -shared -fPIC -o "$T/hang_testall.so" test/hang_testall.c || bad "mpicc could not build test/hang_testall.c"
stuck() {
    name=$1 sig=$2 timeout1=$3
    PORT=$(free_port)
    for rank in 1 0; do
        if [ $rank -eq 1 ]; then pre="LD_PRELOAD=$T/hang_testall.so" tmo=$timeout1; else pre="CT_NO_PRELOAD=1" tmo=2; fi
        env "$pre" CTRAIN_COMM_TIMEOUT=$tmo WORLD_SIZE=2 RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$B" \
            --config "$T/sgd.json" --set train.max_steps=100000000 --set train.save_interval=0 \
            --set train.run_dir=\""$T/$name"\" >"$T/$name$rank.out" 2>"$T/$name$rank.err" &
        [ $rank -eq 1 ] && victim=$! || survivor=$!
    done
    if ends_within "$survivor" 150; then ok "$name: rank 0 ended on its watchdog once rank 1 hung in MPI_Testall"
    else bad "$name: rank 0 still running after 15 s"; kill -9 "$survivor"; fi
    wait "$survivor" 2>/dev/null
    [ "$sig" != - ] && kill -"$sig" "$victim"
    t0=$(date +%s)
    if ends_within "$victim" $((10 * timeout1 + 35)); then
        wait "$victim"
        rc=$?
        ok "$name: the stuck rank ended within $(( $(date +%s) - t0 + 1 )) s (timeout $timeout1 s)"
    else
        rc=-1
        bad "$name: the stuck rank is still running $((timeout1 + 3)) s after SIG$sig"; kill -9 "$victim"; wait "$victim"
    fi
    echo "$rc"   >"$T/$name.rc"
}
stuck hang_alone - 2
eq "a rank stuck in MPI_Testall ends with exit 1" "$(cat "$T/hang_alone.rc")" 1
has "$T/hang_alone1.err" "rank 1 of 2: MPI all-reduce (non-blocking) has waited [0-9]* s for the other ranks (CTRAIN_COMM_TIMEOUT=2)" \
    "the stuck rank's watchdog names the wait and the timeout"
stuck hang_term TERM 5
eq "SIGTERM to a rank stuck in MPI_Testall: exit 143" "$(cat "$T/hang_term.rc")" 143
has "$T/hang_term1.err" "rank 1 of 2: SIGTERM came [0-9]* s ago, and MPI all-reduce (non-blocking) has waited [0-9]* s .*ends now without saving (exit 143)" \
    "SIGTERM to a stuck rank: the line says why it ends without saving"
# rank 0's ompi-server (its address file under TMPDIR=$T names it) ends with rank 0
sleep 0.2
# ([c]: the grep's own command line, in the list too, does not match)
[ -z "$(grep -l -a "$T/[c]train-rendezvous" /proc/[0-9]*/cmdline 2>/dev/null)" ] && ok "no ompi-server outlived rank 0" ||
    bad "an ompi-server outlived its rank 0"

# the environment launch's errors
env_case() {   # env_case DESCRIPTION CODE PATTERN VAR=VALUE...
    what=$1 code=$2 pat=$3
    shift 3
    env "$@" "$B" --config "$T/sgd.json" --set train.run_dir=\""$T/env"\" >"$T/out" 2>"$T/err"
    rc=$?
    [ $rc -eq "$code" ] && ok "$what: exit $code" || bad "$what: exit $rc, expected $code"
    has "$T/err" "$pat" "$what: the message names $pat"
}
env_case "WORLD_SIZE=abc" 2 'WORLD_SIZE="abc"' WORLD_SIZE=abc
env_case "CTRAIN_COMM_TIMEOUT=soon" 2 'CTRAIN_COMM_TIMEOUT="soon"' CTRAIN_COMM_TIMEOUT=soon
env_case "RANK >= WORLD_SIZE" 2 'RANK="2"' WORLD_SIZE=2 RANK=2
env_case "WORLD_SIZE=2 without RANK" 2 'WORLD_SIZE=2 without RANK' WORLD_SIZE=2
env_case "WORLD_SIZE=2 without MASTER_ADDR" 2 'without MASTER_ADDR' WORLD_SIZE=2 RANK=1 MASTER_PORT=29500
env_case "MASTER_PORT=99999" 2 'MASTER_PORT="99999"' WORLD_SIZE=2 RANK=0 MASTER_PORT=99999
env_case "rank 0 alone" 1 'waited 1 s (CTRAIN_COMM_TIMEOUT) on port [0-9]* for rank 1 to connect' \
    WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((PORT + 1)) CTRAIN_COMM_TIMEOUT=1
env_case "rank 1 alone" 1 'could not reach rank 0 at 127.0.0.1 port [0-9]* for 1 s' \
    WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((PORT + 1)) CTRAIN_COMM_TIMEOUT=1
"$B" --config "$T/sgd.json" --world-size 2 --set train.run_dir=\""$T/env"\" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok "--world-size 2 without a launcher: exit 2" || bad "--world-size 2 without a launcher: exit $rc, expected 2"
has "$T/err" "mpirun -np 2" "--world-size 2 without a launcher: the message names mpirun"
env WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$B" --config "$T/sgd.json" --set train.run_dir=\""$T/env1"\" >"$T/out" 2>"$T/err" &&
    ok "WORLD_SIZE=1 RANK=0 trains as one process" || bad "WORLD_SIZE=1 RANK=0 (exit $?)"
$MPIRUN -np 2 "$B" --config "$T/sgd.json" --set zero_optimization.stage=3 --set train.sample_every=5 \
    --set train.run_dir=\""$T/z3"\" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok "stage 3 with train.sample_every refused (exit 2)" || bad "stage 3 with train.sample_every: exit $rc, expected 2"
has "$T/err" "train.sample_every with zero_optimization.stage 3" "the refusal names both keys"
[ -e "$T/z3/config.json" ] && bad "a refused run wrote run_dir/config.json" || ok "a refused run wrote no config.json"

# --- ranks started alike, or not at all: every rank compares its resolved config and its data's
# fingerprint with rank 0's before the first collective that depends on them (core/dist/agree.h).
# mismatch NAME KEY_TEXT RANK1_ARGS...: rank 0 with the sgd config, rank 1 with RANK1_ARGS (mpirun's
# two-program form); both exit 2, and the message names the ranks and the first key that differs
sed 's/"out": 6/"out": 7/' "$T/sgd.json" >"$T/sgd_w7.json"
mkdir -p "$T/elsewhere" && cp "$T/sgd.json" "$T/elsewhere/sgd.json"
random_csv "$T/elsewhere/train.csv" 300 13 5 8   # the same name and shape, other numbers
mismatch() {
    name=$1 key=$2
    shift 2
    $MPIRUN -np 1 "$B" --config "$T/sgd.json" --set train.run_dir=\""$T/$name"\" : \
        -np 1 "$B" --set train.run_dir=\""$T/$name"\" "$@" >"$T/$name.out" 2>"$T/$name.err"
    rc=$?
    [ $rc -eq 2 ] && ok "$name: exit 2" || { bad "$name: exit $rc, expected 2"; tail -3 "$T/$name.err"; }
    has "$T/$name.err" "^ctrain: error: ranks 0 and 1 were started with different configs or data: $key" \
        "$name: names the ranks and the key"
    [ -e "$T/$name/config.json" ] && bad "$name: rank 0 wrote config.json" || ok "$name: nothing written"
}
mismatch stage_mismatch "zero_optimization.stage is 0 on rank 0 and 2 on rank 1" --config "$T/sgd.json" \
    --set zero_optimization.stage=2
mismatch width_mismatch "model.layers\[0\].out is 6 on rank 0 and 7 on rank 1" --config "$T/sgd_w7.json"
mismatch lr_mismatch "optimizer.params.lr is 0.05 on rank 0 and 0.1 on rank 1" --config "$T/sgd.json" \
    --set optimizer.params.lr=0.1
mismatch limit_mismatch "data.train.limit is absent on rank 0 and 200 on rank 1" --config "$T/sgd.json" \
    --set data.train.limit=200
mismatch data_mismatch "data.train (its files) is 1 file, [0-9]* bytes, content [0-9a-f]* on rank 0 and 1 file" \
    --config "$T/elsewhere/sgd.json"

# two processes that say they are one rank: RANK 1 twice (of 3: rank 0 waits for both), RANK 0
# twice; every process ends with exit 2 and rank 0's message naming both. (Two RANK=0 with one
# train.run_dir: the second stops at the run directory's lock first, naming the first's pid.)
# dup NAME WORLD SAME|OWN RANKS...: the processes, started 0.3 s apart on MASTER_PORT=$PORT, with one
# run_dir or one each; their exit statuses, once each
dup() {
    name=$1 world=$2 dirs=$3 pids=""
    shift 3
    for r in "$@"; do
        dir=$T/$name
        [ "$dirs" = OWN ] && dir=$T/$name.$r.$(echo "$pids" | wc -w)
        WORLD_SIZE=$world RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT CTRAIN_COMM_TIMEOUT=3 "$B" \
            --config "$T/sgd.json" --set train.run_dir=\""$dir"\" >/dev/null 2>>"$T/$name.err" &
        pids="$pids $!"
        sleep 0.3
    done
    rcs=""
    for p in $pids; do wait "$p"; rcs="$rcs $?"; done
    echo "$rcs" | tr ' ' '\n' | sort -u | tr '\n' ' '
}
PORT=$(free_port)
eq "RANK=1 twice: every process exits 2" "$(dup dup1 3 SAME 1 1 0)" " 2 "
eq "RANK=1 twice: all three say so, naming both processes" \
    "$(grep -c "two processes say they are RANK=1 of WORLD_SIZE=3: pid [0-9]* on host .* (connected first) and pid [0-9]* on host" "$T/dup1.err")" 3
PORT=$(free_port)
eq "RANK=0 twice: both exit 2" "$(dup dup0 2 OWN 0 0)" " 2 "
eq "RANK=0 twice: both say so" \
    "$(grep -c "two processes say they are RANK=0 of WORLD_SIZE=2: pid [0-9]* on host .* (listening on port [0-9]*) and pid" "$T/dup0.err")" 2
PORT=$(free_port)
eq "RANK=0 twice in one run_dir: the second exits 2 at the lock, the first 1 after the timeout" \
    "$(dup dup0s 2 SAME 0 0)" " 1 2 "
has "$T/dup0s.err" "is in use by another ctrain run (pid [0-9]*, which holds" "RANK=0 twice in one run_dir: the lock names the first"
# mpirun numbers its ranks itself; its variables set by hand on a process mpirun did not start
env_case "OMPI_COMM_WORLD_RANK by hand" 2 'MPI says this process is rank 0 of 1, but mpirun (OMPI_COMM_WORLD_SIZE) says rank 1 of 2' \
    OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1

# a config asking for another kind of training is refused on every rank, not trained as data
# parallelism (docs/config.md, "Another kind of training: refused")
$MPIRUN -np 2 "$B" --config "$T/sgd.json" --set pipeline.stages=2 --set train.run_dir=\""$T/pp"\" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && ok "pipeline.stages 2 under mpirun -np 2: exit 2" || bad "pipeline.stages 2 under mpirun -np 2: exit $rc, expected 2"
has "$T/err" "pipeline.stages: pipeline parallelism over 2 stages is not implemented" "pipeline.stages 2: the refusal names the key"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
