#!/bin/sh
# e2e_curriculum.sh: curriculum learning by sequence length (curriculum_learning, seqlen) cuts each
# step's sequences as DeepSpeed does (tokens[:, :seqlen], labels[:, :seqlen]): two steps at
# length 4 of a model with model.input [8] give bit for bit the weights of the same model built
# for [4] trained on the same first four tokens of each sample; the third step runs at full
# length, also after a resume; tokens/s counts the cut tokens; bad schedules are config errors.
# The data is written so that the cut and the short model see the same targets: byte 4 of each
# 8-byte sample equals byte 0 of the next (the short file's next token).
# Usage: sh test/e2e_curriculum.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
scratch_dir

awk 'BEGIN {
    srand(7); n = 16
    for (i = 0; i <= n * 8; i++) a[i] = 97 + int(rand() * 26)
    for (i = 0; i < n; i++) a[(i + 1) * 8] = a[i * 8 + 4]
    for (i = 0; i <= n * 8; i++) printf "%c", a[i] > "'"$T"'/long.txt"
    for (i = 0; i < n; i++) for (j = 0; j < 4; j++) printf "%c", a[i * 8 + j] > "'"$T"'/short.txt"
    printf "%c", a[n * 8] > "'"$T"'/short.txt"
}'
"$B" pack --from text "$T/long.txt" --out "$T/long" >/dev/null 2>&1 &&
    "$B" pack --from text "$T/short.txt" --out "$T/short" >/dev/null 2>&1 || { bad "pack failed"; exit 1; }

# config T CURRICULUM: the model for sequences of T bytes, with or without the curriculum section
config() {
    cat <<EOF
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
 $2
 "model": {"input": [$1], "layers": [
   {"type": "embedding", "name": "wte", "vocab": 256, "dim": 16},
   {"type": "position_embedding", "name": "wpe", "max_len": 8},
   {"type": "repeat", "times": 2, "layers": [{"type": "transformer_block", "heads": 2}]},
   {"type": "layernorm", "name": "ln_f"},
   {"type": "linear", "name": "head", "out": 256, "bias": false, "tie": "wte.weight"}]},
 "data": {"train": {"format": "tokens", "path": "$3/tokens.bin", "seq_len": $1}, "shuffle": false},
 "train": {"epochs": 1, "seed": 3, "save_interval": 1}}
EOF
}
CUR='"curriculum_learning": {"enabled": true, "curriculum_type": "seqlen", "min_difficulty": 4,
  "max_difficulty": 8, "schedule_type": "fixed_discrete", "schedule_config": {"difficulty": [4, 8], "max_step": [2]}},'
config 8 "$CUR" "$T/long" >"$T/cur.json"
config 4 "" "$T/short" >"$T/short.json"

"$B" --config "$T/cur.json" --set train.max_steps=2 --set train.run_dir=\""$T/a"\" --summary "$T/a.json" >/dev/null 2>"$T/a.err" ||
    bad "curriculum run: $(tail -3 "$T/a.err")"
"$B" --config "$T/short.json" --set train.max_steps=2 --set train.run_dir=\""$T/b"\" >/dev/null 2>"$T/b.err" ||
    bad "short model run: $(tail -3 "$T/b.err")"
ma=$(find "$T/a" -path "*global_step2/model.safetensors"); mb=$(find "$T/b" -path "*global_step2/model.safetensors")
if [ -n "$ma" ] && [ -n "$mb" ] && cmp -s "$ma" "$mb"; then
    ok "two steps cut to 4 of 8 positions = the model built for 4, bit for bit"
else
    bad "the cut steps differ from the short model ($ma vs $mb)"
fi
# 4 samples x 4 tokens a step, not 4 x 8
has "$T/a.err" "^step 2/2 .* tokens/s" "step lines in tokens/s"
tps=$(sed -n 's/.*"tokens_per_s":\([^,}]*\).*/\1/p' "$T/a.json")
sps=$(sed -n 's/.*"samples_per_s":\([^,}]*\).*/\1/p' "$T/a.json")
awk -v t="$tps" -v s="$sps" 'BEGIN { r = t / s; exit !(r > 3.99 && r < 4.01) }' &&
    ok "tokens/s counts the cut tokens (4 per sample)" || bad "tokens_per_s $tps vs samples_per_s $sps"

# step 3 at full length, resumed from step 2 and straight through: the same weights
"$B" --config "$T/cur.json" --set train.max_steps=3 --set train.run_dir=\""$T/a"\" --resume auto >/dev/null 2>"$T/c.err" ||
    bad "resume to step 3: $(tail -3 "$T/c.err")"
"$B" --config "$T/cur.json" --set train.max_steps=3 --set train.run_dir=\""$T/d"\" >/dev/null 2>"$T/d.err" ||
    bad "straight to step 3: $(tail -3 "$T/d.err")"
mc=$(find "$T/a" -path "*global_step3/model.safetensors"); md=$(find "$T/d" -path "*global_step3/model.safetensors")
if [ -n "$mc" ] && [ -n "$md" ] && cmp -s "$mc" "$md" && ! cmp -s "$mc" "$ma"; then
    ok "step 3 at full length, the same after a resume"
else
    bad "step 3: resumed and straight runs differ ($mc vs $md)"
fi

# a schedule longer than the model and a model that is not a token sequence: config errors, already
# in a dry run
expect2() {
    "$B" --config "$T/cur.json" --dry-run "$@" >/dev/null 2>"$T/e.err"
    rc=$?
    [ $rc -eq 2 ] || bad "exit $rc (expected 2) for $*"
}
expect2 --set curriculum_learning.max_difficulty=16
has "$T/e.err" "max_difficulty 16 must satisfy 1 <= min <= max <= the model's sequence length 8" \
    "max_difficulty above model.input: exit 2 naming both"
cat >"$T/mlp.json" <<EOF
{"train_batch_size": 4, $CUR
 "model": {"input": [8], "layers": [{"type": "linear", "out": 3}]},
 "data": {"train": {"format": "csv", "path": "x.csv"}}}
EOF
"$B" --config "$T/mlp.json" --dry-run >/dev/null 2>"$T/e.err"
rc=$?
[ $rc -eq 2 ] && has "$T/e.err" "curriculum_learning (seqlen) cuts token sequences" \
    "a model of float features: exit 2 in a dry run" || bad "float model with a seqlen curriculum: exit $rc"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
