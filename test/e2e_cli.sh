#!/bin/sh
# End-to-end checks of the command line: exit codes, override forms, help/man page in sync.
# Usage: e2e_cli.sh BUILD_DIR
set -u
B=${1:-build}/ctrain
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. test/lib_e2e.sh
# expect CODE DESCRIPTION -- command...: run, compare the exit code, keep output in $T/out, $T/err
expect() {
    code=$1; what=$2; shift 3
    "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq "$code" ]; then ok "$what"; else bad "$what (exit $rc, expected $code)"; sed 's/^/     /' "$T/err" | head -5; fi
}

expect 0 "--version" -- "$B" --version
has "$T/out" "^ctrain [0-9]" "--version prints the version"
has "$T/out" "backends: cpu" "--version lists backends"
expect 0 "--help" -- "$B" --help
# Every long option in --help appears in the man page (kept in sync).
for opt in $(grep -o -- '--[a-z][a-z_-]*' "$T/out" | sort -u); do
    manopt=$(printf '%s' "$opt" | sed 's/-/\\\\-/g')
    grep -q -- "$manopt" docs/ctrain.1 || bad "man page lacks $opt"
done
ok "help and man page list the same options"

expect 2 "no arguments" -- "$B"
expect 2 "unknown option" -- "$B" --config x.json --frobnicate
has "$T/err" "unknown option" "unknown option is named"
for sub in plot compare; do
    expect 2 "$sub without a run directory" -- "$B" $sub
    has "$T/err" "at least one run directory" "$sub asks for a run directory"
done
expect 2 "unknown command" -- "$B" frobnicate
has "$T/err" "unknown command \"frobnicate\" (commands: config eval " "an unknown command lists the commands"
# The list comes from cmd/ctrain.c's commands[]; every row has its usage, its synopsis in --help,
# its SYNOPSIS entry in the man page and its entry under docs/cli.md's "Subcommands".
subs=$(sed -n 's/.*(commands: \([^;]*\);.*/\1/p' "$T/err")
[ -n "$subs" ] || bad "the unknown command's message lists no commands"
"$B" --help > "$T/help" 2>&1
for sub in $subs; do
    expect 0 "$sub --help exits 0" -- "$B" $sub --help
    has "$T/out" "^usage: ctrain $sub" "$sub --help prints its usage on stdout"
    grep -q "^       ctrain $sub" "$T/help" || bad "ctrain --help lacks the synopsis of $sub"
    mansub=$(printf '%s' "$sub" | sed 's/-/\\\\-/g')
    grep -q "^\.B ctrain $mansub" docs/ctrain.1 || bad "the man page's SYNOPSIS lacks ctrain $sub"
    sed -n '/^## Subcommands/,/^## [^S]/p' docs/cli.md | grep -q "^- \`ctrain $sub" ||
        bad "docs/cli.md's Subcommands lack ctrain $sub"
done
ok "every command has its usage, its synopsis in --help and the man page, and its entry in docs/cli.md"
expect 0 "-h after other arguments" -- "$B" export --checkpoint x -h
expect 2 "missing config file" -- "$B" --config "$T/nope.json" --print-config
has "$T/err" "nope.json" "missing config names the path"
expect 2 "--set without =" -- "$B" --config x.json --set foo

cat > "$T/c.json" <<'JSON'
{
  "train_micro_batch_size_per_gpu": 8,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}
}
JSON
expect 0 "--print-config" -- "$B" --config "$T/c.json" --print-config
has "$T/out" '"train_batch_size":[[:space:]]*16' "batch derived in --print-config"
expect 0 "three override forms" -- "$B" --config "$T/c.json" --print-config \
    --set optimizer.params.lr=0.25 --gradient_accumulation_steps=4 train_micro_batch_size_per_gpu=3 --local_rank=1
has "$T/out" '"lr":[[:space:]]*0.25' "--set applied"
has "$T/out" '"gradient_accumulation_steps":[[:space:]]*4' "--KEY=VALUE applied"
has "$T/out" '"train_micro_batch_size_per_gpu":[[:space:]]*3' "KEY=VALUE applied"
# Numbers in messages as a reader writes them: betas lie in [0, 1) (it printed
# [0, 0.99999999999999978]); 1e999 is a number out of range (it was shown as a string)
expect 2 "betas [0.9, 1]" -- "$B" --config "$T/c.json" --print-config --set 'optimizer.params.betas=[0.9, 1.0]'
has "$T/err" "optimizer.params.betas\[1\]: expected a number in \[0, 1), got 1$" "the betas' range reads [0, 1)"
expect 2 "lr=1e999" -- "$B" --config "$T/c.json" --print-config --set optimizer.params.lr=1e999
has "$T/err" 'got "1e999": a number out of the range of a double' "1e999 is said to be out of range"
# info on a file of no kind it describes says so, not "not a valid safetensors file: header length"
expect 3 "info on a JSON file" -- "$B" info "$T/c.json"
has "$T/err" "c.json is not a file ctrain describes: not safetensors .*It takes: FILE.safetensors" \
    "info says what the file is not and what it takes"
# A misspelt override is refused (a sweep would otherwise train the defaults); in the file it warns.
expect 2 "--lr=0.1 (not a key) refused" -- "$B" --config "$T/c.json" --print-config --lr=0.1
has "$T/err" "c.json: --set lr: unknown key; did you mean optimizer.params.lr?" "--lr names the key it meant"
expect 2 "misspelt --set refused" -- "$B" --config "$T/c.json" --print-config --set optimizer.params.lrr=0.1
has "$T/err" "did you mean optimizer.params.lr?" "misspelt --set gets a suggestion"
printf '{"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lrr": 0.1}}}\n' >"$T/typo.json"
expect 0 "a typo in the file only warns" -- "$B" --config "$T/typo.json" --print-config
has "$T/err" "optimizer.params.lrr: unknown key (ignored); did you mean optimizer.params.lr?" "file typo warned"
expect 2 "bad stage" -- "$B" --config "$T/c.json" --print-config --set zero_optimization.stage=4
has "$T/err" "zero_optimization.stage" "bad stage names the JSON path"

# The launcher's world size: a malformed value is a usage error naming the variable (it was taken as 1)
expect 2 "WORLD_SIZE=abc refused" -- env WORLD_SIZE=abc "$B" --config "$T/c.json" --print-config
has "$T/err" 'WORLD_SIZE="abc"' "the message names the variable and its value"
expect 2 "config check: OMPI_COMM_WORLD_SIZE=0 refused" -- env OMPI_COMM_WORLD_SIZE=0 "$B" config check "$T/c.json"
has "$T/err" "OMPI_COMM_WORLD_SIZE" "config check names the variable"
expect 0 "--world-size wins over the environment" -- env WORLD_SIZE=abc "$B" --config "$T/c.json" --print-config --world-size 1
expect 0 "WORLD_SIZE=2 read" -- env WORLD_SIZE=2 "$B" config check "$T/c.json"
has "$T/out" "world 2" "WORLD_SIZE=2 is the world size"

# config check says what is accepted but not used yet, and does not show ZeRO as active
cat > "$T/z.json" <<'JSON'
{
  "train_batch_size": 16,
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
  "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true},
  "wall_clock_breakdown": true
}
JSON
expect 0 "config check (ZeRO and friends)" -- "$B" config check "$T/z.json"
has "$T/out" '^accepted, not used yet:$' "config check prints the not-yet heading"
# one process with offload_optimizer: ZeRO-Offload on a device, nothing moves on the CPU (not "not used yet")
if grep -q 'zero_optimization.stage 2: accepted\|offload_optimizer.device cpu: accepted' "$T/out"; then
    bad "config check lists optimizer offload as not used yet"; else ok "optimizer offload is not listed as not used yet"; fi
has "$T/out" '^zero .*stage 2 with optimizer offload (one process): on a device' "config check says what optimizer offload does where"
has "$T/out" '^  activation_checkpointing.cpu_checkpointing true: does nothing here: no layer is checkpointed' "config check says activation offload has nothing to offload"
if grep -q 'partition_activations' "$T/out"; then bad "partition_activations (a no-op) listed as not used"; else ok "partition_activations accepted"; fi
if grep -q 'wall_clock_breakdown' "$T/out"; then bad "wall_clock_breakdown (acted on) listed as not used"; else ok "wall_clock_breakdown not listed"; fi
if grep -q '^zero  *stage 2, offload' "$T/out"; then bad "config check prints ZeRO as if active"; else ok "ZeRO not printed as active"; fi
if grep -q 'read but not used.*activation_checkpointing' "$T/err"; then bad "activation_checkpointing reported twice"; else ok "no double report"; fi
expect 0 "config check (nothing switched on)" -- "$B" config check "$T/c.json"
if grep -q 'not used yet' "$T/out"; then bad "not-yet heading without a setting on"; else ok "no not-yet heading when nothing is on"; fi

CORPUS=test/conformance/ds_configs
if [ -d "$CORPUS" ]; then
    expect 0 "config check (corpus file)" -- "$B" config check "$CORPUS/microsoft__DeepSpeedExamples__cifar_ds_config.json" --world-size 8
    expect 2 "config check rejects W=8 batch" -- "$B" config check "$CORPUS/microsoft__DeepSpeedExamples__training_data_efficiency_gpt_finetuning_config_ds_config_gpt_base_random_ltd.json" --world-size 8
fi

# Runs on a small random CSV data set (16 features, 4 classes): an MLP, steps of 32 samples.
random_csv "$T/train.csv" 640 16 4 7
random_csv "$T/eval.csv" 128 16 4 8
cat > "$T/run.json" <<'JSON'
{"train_batch_size": 32, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "model": {"input": [16], "layers": [{"type": "linear", "name": "fc1", "out": 32}, {"type": "relu", "name": "r1"},
           {"type": "linear", "name": "fc2", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}, "eval": {"format": "csv", "path": "eval.csv"}},
 "train": {"epochs": 2, "seed": 3, "device": "cpu", "threads": 1}}
JSON
R="$T/run.json"

# null means "not set" in ctrain's own sections too (the dataset openers never see it)
expect 0 "--set data.train.limit=null trains" -- "$B" --config "$R" --quiet --set train.run_dir=\""$T/null"\" \
    --set data.train.limit=null --set data.transform=null --set model.layers.0.init=null
has "$T/out" '"status":"ok","steps":40' "null keys: the whole data set (20 steps x 2 epochs)"

# A hand-edited state.json whose loader position (epoch_sample) lies beyond the epoch (640
# samples here) is refused, as a data error naming the file and the field, instead of resuming
# somewhere else; so is an epoch_step beyond it in a checkpoint without epoch_sample (written
# before it was recorded: the position is epoch_step steps of its train_batch_size).
ck="$T/null/checkpoints/global_step40"
cp "$ck/state.json" "$T/state.saved"
sed 's/"epoch_sample":[[:space:]]*[0-9]*/"epoch_sample": 700/' "$T/state.saved" >"$ck/state.json"
expect 3 "resume: epoch_sample beyond the epoch refused" -- "$B" --config "$R" --quiet --set train.run_dir=\""$T/null"\" \
    --resume "$ck"
has "$T/err" "global_step40/state.json: epoch_sample: 700 is beyond the epoch (640 samples" "the file and the field are named"
# (the key renamed, not removed: the marker's size of state.json still holds)
sed -e 's/"epoch_step":[[:space:]]*[0-9]*/"epoch_step": 23/' -e 's/"epoch_sample"/"epoch_sampl_"/' "$T/state.saved" >"$ck/state.json"
expect 3 "resume: epoch_step beyond the epoch refused (no epoch_sample)" -- "$B" --config "$R" --quiet \
    --set train.run_dir=\""$T/null"\" --resume "$ck"
has "$T/err" "global_step40/state.json: epoch_step: 23 steps of 32 samples .* beyond the epoch (640 samples" \
    "the file and the field are named (no epoch_sample)"
cp "$T/state.saved" "$ck/state.json"

# ctrain eval takes the run options that apply to an evaluation, in the forms a run takes them
expect 0 "eval --device --seed --set --quiet --summary" -- "$B" eval --config "$R" --checkpoint "$ck" --device cpu \
    --seed 9 --set data.eval.limit=64 --train.threads=1 --quiet --summary "$T/eval.json"
has "$T/eval.json" '"status":"ok","steps":40' "eval wrote its summary"
# an evaluation has no gradients and no optimizer state: neither planned nor allocated
has "$T/eval.json" '"peak_bytes_by_category":{[^}]*"grads":0,"optim":0,' "eval allocated no gradients or optimizer state"
has "$T/eval.json" '"planned_bytes_by_category":{[^}]*"grads":0,"optim":0,' "eval planned no gradients or optimizer state"
expect 2 "eval --device with a bad device" -- "$B" eval --config "$R" --checkpoint "$ck" --device gpu
has "$T/err" "train.device" "eval names the key of a bad --device"
expect 2 "eval --seed -1" -- "$B" eval --config "$R" --checkpoint "$ck" --seed -1
has "$T/err" "seed: expected a non-negative integer" "eval checks --seed"
expect 2 "eval: a misspelt override" -- "$B" eval --config "$R" --checkpoint "$ck" --set data.eval.limt=5
has "$T/err" "did you mean data.eval.limit?" "eval: misspelt override named"

FM=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
if [ -f "$FM" ]; then
    expect 0 "pack idx into a shard" -- "$B" pack --from idx "$FM" --out "$T/shards"
    expect 0 "info on a shard directory" -- "$B" info "$T/shards"
    has "$T/out" "records  10000" "info counts the records"
    head -c 1000 "$T"/shards/*.cts > "$T/bad.cts"
    expect 3 "info on a truncated shard" -- "$B" info "$T/bad.cts"
    has "$T/err" "bad.cts: truncated" "truncated shard named"
fi

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
