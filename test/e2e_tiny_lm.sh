#!/bin/sh
# e2e_tiny_lm.sh: configs/tiny_lm.json (a byte-level GPT: token and position embeddings, 4 pre-norm
# blocks of causal attention and a GELU MLP, tied head) learns English beyond byte frequencies in
# a CI-sized run: 80 steps on the licence texts of /usr/share/common-licenses (the half of
# `make data-text` every Debian has), eval loss below 2.9 nats per byte (a model of byte
# frequencies alone stays near 3; the untrained model is at ln 256 = 5.5), tokens/s and perplexity
# reported, and the checkpoint resumes. The full default run on `make data-text` reaches 1.71 (docs/BENCHMARKS.md).
# Usage: sh test/e2e_tiny_lm.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
scratch_dir
licence_tokens "$B" "$T/lic"

run() {
    "$B" --config configs/tiny_lm.json --set data.train.path=\""$T/lic/train.bin"\" \
        --set data.eval.path=\""$T/lic/eval.bin"\" --set data.eval.limit=64 --set train.eval_interval=0 \
        --set train.run_dir=\""$T/run"\" --summary "$T/s.json" "$@" >/dev/null 2>"$T/err"
}
field() { sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p" "$T/s.json"; }

if run --set train.max_steps=80; then
    loss=$(field eval_loss)
    awk -v l="$loss" 'BEGIN { exit !(l < 2.9) }' && ok "80 steps: eval loss $loss < 2.9" || bad "80 steps: eval loss $loss"
    has "$T/err" "^epoch 1/2 done .* [0-9]* tokens/s" "the epoch line counts tokens, not samples"
    has "$T/err" "^eval .* loss [0-9.]*  ppl [0-9.]*  accuracy" "eval prints the perplexity"
    tps=$(field tokens_per_s)
    awk -v t="$tps" 'BEGIN { exit !(t > 0) }' && ok "tokens/s reported: $tps" || bad "tokens_per_s: $tps"
else
    bad "tiny_lm did not train: $(tail -5 "$T/err")"
fi
# the same run resumed for 10 more steps from its checkpoint
if run --set train.max_steps=90 --resume auto && [ "$(field steps)" = 90 ]; then
    ok "resumed to step 90"
else
    bad "resume: $(cat "$T/s.json" 2>/dev/null) $(tail -3 "$T/err")"
fi

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
