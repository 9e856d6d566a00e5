#!/bin/sh
# e2e_kv_cache.sh: `ctrain generate` with its key/value cache (issue #31) gives the tokens it gives
# without it (--no-kv-cache), and a Hugging Face Llama's greedy tokens are transformers' generate().
#  - a byte-level GPT (learned positions, layernorm, gelu) and a Llama (rmsnorm, rotary positions,
#    2 kv heads of 4, SwiGLU), each trained for a few seconds on the licence texts with a context of
#    32: greedy and sampled text from a short prompt past three contexts, and from a prompt longer
#    than the context, is the same with and without the cache; the closing line says the cache
#    answered the tokens inside the first window and a forward of the window ran for the rest (the window
#    slides: test_train's "generate" case holds the logits themselves);
#  - the random Llamas of test/ref/gen_hf_llama.py (gqa: 2 kv heads of 4; mqa: 1), loaded with
#    model.init_from and saved by a one-step run of lr 0: ctrain's greedy tokens from a 3-token
#    prompt to the end of the 16-token context equal those of LlamaForCausalLM.generate() in fp32,
#    whose smallest gap between the two likeliest tokens is printed and must be above 1e-4 (below
#    it fp32 rounding could pick either, and the check would prove nothing).
# Usage: sh test/e2e_kv_cache.sh BUILD_DIR. Fails, naming it, without /usr/bin/python3 or transformers
# in the tests' venv (make deps installs both; CT_HF_LIVE=optional leaves the transformers part out).
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
PY=/usr/bin/python3
HFPY=${CT_HF_PYTHON:-${CT_TEST_VENV:-.venv}/bin/python}
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
[ -x "$PY" ] || missing_dep "/usr/bin/python3"
scratch_dir
licence_tokens "$B" "$T/lic"

# train NAME BLOCK: a byte-level model of context 32 with BLOCK as its one block
train() {
    cat >"$T/$1.json" <<EOF
{"train_batch_size": 16, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "model": {"input": [32], "layers": [
   {"type": "embedding", "name": "wte", "vocab": 256, "dim": 32}, $2,
   {"type": "linear", "name": "head", "out": 256, "bias": false}]},
 "data": {"train": {"format": "tokens", "path": "$T/lic/train.bin", "seq_len": 32}},
 "train": {"max_steps": 60, "seed": 1, "run_dir": "$T/$1"}}
EOF
    "$B" --config "$T/$1.json" >/dev/null 2>"$T/$1.err" || bad "training $1: $(tail -3 "$T/$1.err")"
}
train gpt '{"type": "position_embedding", "name": "wpe", "max_len": 32},
   {"type": "transformer_block", "heads": 2}, {"type": "layernorm", "name": "ln_f"}'
train llama '{"type": "llama_block", "heads": 4, "kv_heads": 2, "intermediate": 64},
   {"type": "rmsnorm", "name": "norm"}'

long="Permission is hereby granted, free of charge, to any person obtaining a copy"
for model in gpt llama; do
    G() { "$B" generate --checkpoint "$T/$model/checkpoints" "$@"; }
    for args in "--temperature 0" "--temperature 1 --seed 4" "--temperature 0.7 --top-k 20 --seed 9"; do
        # shellcheck disable=SC2086
        with=$(G --prompt "The " --tokens 100 $args 2>"$T/with.err")
        # shellcheck disable=SC2086
        without=$(G --prompt "The " --tokens 100 $args --no-kv-cache 2>"$T/without.err")
        [ -n "$with" ] && [ "$with" = "$without" ] && ok "$model, $args: 100 tokens past three contexts, the same with the cache" ||
            { bad "$model, $args: [$with] vs [$without]"; cat "$T/with.err"; }
    done
    has "$T/with.err" "kv cache [0-9.]* KiB" "$model: the start line gives the cache's size"
    # 4 + 100 tokens, a context of 32: the first token (the prompt's fill) and the 72 after the window
    # is full run a forward from position 0, the 28 between decode one position from the cache
    has "$T/with.err" "28 from the kv cache, 72 by a forward from position 0" \
        "$model: the cache answered the first window's tokens"
    has "$T/without.err" "no kv cache (--no-kv-cache)" "$model: --no-kv-cache says so"
    with=$(G --prompt "$long" --tokens 40 --temperature 1 --seed 2 2>/dev/null)
    without=$(G --prompt "$long" --tokens 40 --temperature 1 --seed 2 --no-kv-cache 2>/dev/null)
    [ -n "$with" ] && [ "$with" = "$without" ] && ok "$model: a prompt longer than the context, the same with the cache" ||
        bad "$model: long prompt: [$with] vs [$without]"
done

# ---- a Hugging Face Llama against transformers' generate() ----
live=no
[ -x "$HFPY" ] && "$HFPY" -c "import transformers" 2>/dev/null && live=yes
[ $live = yes ] || [ "${CT_HF_LIVE:-required}" = optional ] ||
    missing_dep "python module transformers in $HFPY (datasets/requirements-test.txt, on Debian's python3-torch)"
GEN=test/ref/gen_hf_llama.py
PROMPT=40,7,21
for case in gqa mqa; do
    [ $live = yes ] || break
    d=$T/hf_$case
    mkdir -p "$d"
    cp test/ref/hf_llama/eval.bin "$d/"
    "$PY" $GEN --weights "$d/hf" --case $case || bad "gen_hf_llama.py --weights $case"
    "$PY" $GEN --config $case "$d/cfg.json" || bad "gen_hf_llama.py --config $case"
    "$B" --config "$d/cfg.json" --set train.run_dir=\""$d/run"\" >/dev/null 2>"$d/err" ||
        { bad "$case: the lr-0 run: $(tail -3 "$d/err")"; continue; }
    ours=$("$B" generate --checkpoint "$d/run/checkpoints" --prompt-ids $PROMPT --tokens 13 --temperature 0 2>"$d/gen.err")
    theirs=$("$HFPY" - "$d/hf" $PROMPT 13 <<'PYEOF'
import sys
import torch
import transformers
import transformers.generation.utils as gen_utils
# generate() asks whether the model is wrapped by FSDP, importing torch.distributed.fsdp, which
# Debian's torch 1.13 cannot import on Python 3.11 (a dataclass with a mutable default): it is not
gen_utils.is_fsdp_managed_module = lambda module: False
model_dir, prompt, n = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
m = transformers.LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager").float().eval()
m.generation_config.eos_token_id = None   # the random model's token 2 (Llama's default EOS) is a token like another
transformers.logging.set_verbosity_error()
ids = torch.tensor([prompt])
with torch.no_grad():
    out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0,
                     output_scores=True, return_dict_in_generate=True)
gap = min((s[0].topk(2).values[0] - s[0].topk(2).values[1]).item() for s in out.scores)
print("smallest top-2 gap %.3g" % gap, file=sys.stderr)
if gap <= 1e-4:
    sys.exit("two tokens within 1e-4 of each other: the greedy comparison would prove nothing")
print(",".join(str(t) for t in out.sequences[0].tolist()))
PYEOF
)
    [ -n "$ours" ] && [ "$ours" = "$theirs" ] && ok "$case: greedy tokens equal transformers' generate(): $ours" ||
        { bad "$case: ctrain [$ours] vs transformers [$theirs]"; cat "$d/gen.err"; }
    has "$d/gen.err" "12 from the kv cache" "$case: ctrain decoded them from its cache"
done

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
