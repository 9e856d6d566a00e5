# lib_e2e.sh: helpers shared by the end-to-end scripts (not itself a test); sourced from the repository root
# (`. test/lib_e2e.sh`). Each check prints "ok   ..." or "FAIL ..."; $fails counts failures.
fails=0
# A test exits 77 (skipped) only for what `make deps` cannot give (a GPU, a CPU feature, a
# permission), saying why. What make deps installs (Debian's packages, the tests' Python packages
# in .venv/) must be there: missing, the test fails naming it.
# missing_dep WHAT: fail the test (exit 1) for a missing dependency WHAT that make deps installs.
missing_dep() {
    echo "FAIL missing dependency: $1; make deps installs it"
    exit 1
}
# need_fmnist: D is the Fashion-MNIST package's directory (dataset-fashion-mnist).
need_fmnist() {
    D=/usr/share/datasets/fashion-mnist
    [ -f "$D/train-images-idx3-ubyte.gz" ] || missing_dep "Fashion-MNIST ($D: Debian's dataset-fashion-mnist)"
}
# The tests' virtual environment (make deps-test): CT_TEST_VENV, which `make test` sets, else .venv/
# in the repository (this file is sourced from the repository root).
CT_TEST_VENV=${CT_TEST_VENV:-$(pwd)/.venv}
# need_venv MODULE...: PY is the environment's python, which imports every MODULE.
need_venv() {
    PY=$CT_TEST_VENV/bin/python
    [ -x "$PY" ] || missing_dep "the tests' Python environment $CT_TEST_VENV"
    for nv_m in "$@"; do
        "$PY" -c "import $nv_m" 2>/dev/null || missing_dep "python module $nv_m in $CT_TEST_VENV (datasets/requirements-test.txt, or Debian's python3-* packages)"
    done
}
# scratch_dir: T is a new temporary directory, removed when the script exits.
scratch_dir() {
    T=$(mktemp -d)
    trap 'rm -rf "$T"' EXIT
}
# in_scratch BUILD_DIR: B is the absolute path of BUILD_DIR/ctrain (exit 1 when it is missing), T a
# scratch directory (scratch_dir), and the script goes on in T.
in_scratch() {
    B=${1:-build}/ctrain
    [ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
    B=$(cd "$(dirname "$B")" && pwd)/ctrain
    scratch_dir
    cd "$T" || exit 1
}
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
# eq WHAT GOT WANT: GOT is WANT (as strings).
eq() { if [ "$2" = "$3" ]; then ok "$1 ($2)"; else bad "$1: got $2, expected $3"; fi; }
# has FILE PATTERN DESCRIPTION: FILE contains PATTERN (grep), else show the end of FILE.
has() { if grep -q -- "$2" "$1"; then ok "$3"; else bad "$3: no '$2'"; sed 's/^/     /' "$1" | tail -5; fi; }
# random_csv FILE ROWS FEATURES CLASSES SEED: a CSV data set of random features in [-1, 1) with a
# header line and a random class label in the last column (data without python).
random_csv() {
    awk -v rows="$2" -v feats="$3" -v classes="$4" -v seed="$5" 'BEGIN {
        srand(seed)
        for (f = 0; f < feats; f++) printf "x%d,", f
        print "label"
        for (r = 0; r < rows; r++) {
            for (f = 0; f < feats; f++) printf "%.4f,", 2 * rand() - 1
            print int(rand() * classes)
        }
    }' >"$1"
}
# licence_tokens CTRAIN DIR: byte tokens of the licence texts every Debian has
# (/usr/share/common-licenses, from base-files) in DIR/train.bin and DIR/eval.bin.
licence_tokens() {
    lt_b=$1 lt_d=$2
    set -- /usr/share/common-licenses/*
    [ -f "$1" ] || missing_dep "/usr/share/common-licenses (Debian's base-files)"
    sh datasets/text_tokens.sh --ctrain "$lt_b" "$lt_d" "$@" >"$T/log" 2>&1 || { cat "$T/log"; exit 1; }
}

# ---- a data format trained against the IDX files it was made from (e2e_hdf5.sh, e2e_tfrecord.sh):
# the same small MLP, 40 steps, the same order settings, so the losses must be equal bit for bit.
# They use $B, $T (scratch_dir), $D (need_fmnist) and N_TRAIN / N_EVAL.
# vs_idx_entries: IDX_TRAIN and IDX_EVAL, the first $N_TRAIN / $N_EVAL Fashion-MNIST samples as IDX
# data entries ($D: need_fmnist).
vs_idx_entries() {
    IDX_TRAIN="{\"format\": \"idx\", \"images\": \"$D/train-images-idx3-ubyte.gz\", \"labels\": \"$D/train-labels-idx1-ubyte.gz\", \"limit\": $N_TRAIN}"
    IDX_EVAL="{\"format\": \"idx\", \"images\": \"$D/t10k-images-idx3-ubyte.gz\", \"labels\": \"$D/t10k-labels-idx1-ubyte.gz\", \"limit\": $N_EVAL}"
}

# vs_idx_config NAME TRAIN_ENTRY EVAL_ENTRY: $T/NAME.json, a small MLP on 28x28 images, 40 steps.
vs_idx_config() {
    cat >"$T/$1.json" <<JSON
{
  "train_batch_size": 128, "train_micro_batch_size_per_gpu": 128,
  "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
  "model": {"input": [1, 28, 28],
            "layers": [{"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc1", "out": 64},
                       {"type": "relu", "name": "relu1"}, {"type": "linear", "name": "fc2", "out": 10}],
            "loss": {"type": "cross_entropy"}},
  "data": {"train": $2, "eval": $3, "shuffle": true, "workers": 2,
           "transform": {"normalize": {"mean": [0.2860], "std": [0.3530]}}},
  "train": {"max_steps": 40, "seed": 5, "device": "cpu", "run_dir": "$T/run-$1"}
}
JSON
}

# summary_loss SUMMARY_FILE: "TRAIN_LOSS EVAL_LOSS" of a summary line.
summary_loss() { sed 's/.*"train_loss":\([^,]*\),"eval_loss":\([^,]*\),.*/\1 \2/' "$1"; }
vs_idx_train() { # NAME [ARGS]: train config NAME, summary in $T/NAME.s.json
    n=$1
    shift
    "$B" --quiet --config "$T/$n.json" --summary "$T/$n.s.json" "$@" >/dev/null 2>"$T/err" || bad "train $n: $(cat "$T/err")"
}
same_loss_as_idx() { # NAME WHAT: NAME's losses equal the IDX run's
    [ -n "$(summary_loss "$T/idx.s.json")" ] && [ "$(summary_loss "$T/idx.s.json")" = "$(summary_loss "$T/$1.s.json")" ] &&
        ok "$2: the same train and eval loss as IDX, bit for bit ($(summary_loss "$T/$1.s.json"))" ||
        bad "$2: losses differ: idx $(summary_loss "$T/idx.s.json"), $1 $(summary_loss "$T/$1.s.json")"
}

# free_port: a TCP port P of 127.0.0.1 that, with P + 1 (torchrun's agent holds P and ctrain then
# meets on P + 1), nothing listens on now: the kernel's choice, so that tests running at the same
# time (several suites on one machine) do not pick the same port, as ports derived from the pid did.
free_port() {
    /usr/bin/python3 -c '
import socket
for _ in range(100):
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    if p >= 65535: a.close(); continue
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1)); print(p); break
    except OSError: pass
    finally: a.close(); b.close()
'
}
