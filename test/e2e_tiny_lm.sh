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

# The chunked LM head (model.loss.chunk_rows): 10 steps with the logits whole and in chunks of 500
# of the 4096 rows: the same losses within float rounding (the weight gradient is summed chunk by
# chunk), the start block says so, and the arena the run measured is the plan's.
for c in 0 500; do
    run --set train.max_steps=10 --set model.loss.chunk_rows=$c --set train.run_dir=\""$T/run-c$c"\"
    cp "$T/s.json" "$T/s-c$c.json"
    cp "$T/err" "$T/err-c$c"
done
if python3 - "$T/s-c0.json" "$T/s-c500.json" <<'PY'
import json, sys
w, c = (json.load(open(f)) for f in sys.argv[1:3])
for k in ("train_loss", "eval_loss"):
    if abs(w[k] - c[k]) > 1e-4 * abs(w[k]): sys.exit(f"{k}: whole {w[k]}, chunked {c[k]}")
plan, peak = c["planned_bytes_by_category"]["activations"], c["peak_bytes_by_category"]["activations"]
if plan != peak: sys.exit(f"activations planned {plan}, measured {peak}")
print(f"losses {c['train_loss']} / {c['eval_loss']}, arena {peak} B")
PY
then ok "chunked head: the same losses as the whole head, arena as planned"; else bad "chunked head"; fi
has "$T/err-c500" "^chunked LM head: on, 500 rows per chunk (9 chunks of the 4096 rows; logits 500.0 KiB instead of 4.0 MiB" \
    "the start block says the head is chunked"
grep -q "chunked LM head" "$T/err-c0" && bad "chunk_rows 0: the start block says chunked" || ok "chunk_rows 0: no chunk line"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
