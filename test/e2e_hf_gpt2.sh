#!/bin/sh
# e2e_hf_gpt2.sh: fine-tuning from GPT-2 weights (issue #13). test/ref/gen_hf_gpt2.py writes a small
# GPT-2 (2 layers, 64 wide, 4 heads, sequence 32, vocabulary 256) as Hugging Face's
# model.safetensors; the committed test/ref/hf_gpt2/ holds ctrain's config of the same model
# (vocabulary padded to 320, loss.classes 256), four token sequences and PyTorch's eval loss.
#  - model.init_from loads it (a run of one step at lr 0: the eval at its end sees the weights as
#    loaded, and its checkpoint holds them bit for bit): eval loss within 1e-5 relative of PyTorch's;
#  - `ctrain export --layout hf-gpt2` gives back GPT-2's tensors bit for bit (Conv1D transposed
#    back, the padded vocabulary rows left out, the names prefixed "transformer.");
#  - re-importing the export gives the same checkpoint, byte for byte; so does a file with the
#    prefix and a tied lm_head.weight;
#  - a missing, an extra and a mis-shaped tensor, a model of another shape (an untied head, an
#    unpadded vocabulary without loss.classes) and a bad --layout: exit 2 naming the tensor or layer.
# Usage: sh test/e2e_hf_gpt2.sh BUILD_DIR. Needs /usr/bin/python3 (standard library only).
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
PY=/usr/bin/python3
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
[ -x "$PY" ] || missing_dep "/usr/bin/python3 (Debian's python3)"
scratch_dir
REF=test/ref/hf_gpt2
cp "$REF/gpt.json" "$REF/eval.bin" "$T/"
# weights OPTIONS...: $T/model.safetensors from gen_hf_gpt2.py (standard library only)
weights() { "$PY" test/ref/gen_hf_gpt2.py --weights "$T/model.safetensors" "$@" || bad "gen_hf_gpt2.py $*"; }
# run NAME [CONFIG]: train CONFIG (default gpt.json) into $T/NAME; exit code in $rc, stderr in $T/NAME.err
run() {
    "$B" --config "$T/${2:-gpt.json}" --set train.run_dir=\""$T/$1"\" --summary "$T/$1.json" \
        >/dev/null 2>"$T/$1.err"
    rc=$?
}
# refused NAME DESCRIPTION PATTERN...: the last run exited 2 and its error names every PATTERN
refused() {
    name=$1 what=$2
    shift 2
    [ $rc -eq 2 ] && ok "$what: exit 2" || { bad "$what: exit $rc"; tail -3 "$T/$name.err"; }
    for p in "$@"; do has "$T/$name.err" "$p" "$what: names $p"; done
}
ckpt=checkpoints/global_step1/model.safetensors

# --- load, and PyTorch's eval loss
weights
run a
[ $rc -eq 0 ] && ok "init_from of GPT-2's model.safetensors: exit 0" || { bad "init_from: exit $rc"; tail -5 "$T/a.err"; }
has "$T/a.err" "(Hugging Face GPT-2 layout): 28 of 28 tensors loaded" "all 28 tensors loaded"
"$PY" - "$T/a.json" "$REF/expect.json" <<'EOF' && ok "eval loss within 1e-5 of PyTorch's" || bad "eval loss"
import json, sys
got, want = json.load(open(sys.argv[1]))["eval_loss"], json.load(open(sys.argv[2]))["eval_loss"]
rel = abs(got - want) / want
print("     ctrain %.6g, PyTorch %.9g, relative %.2g" % (got, want, rel))
sys.exit(0 if rel < 1e-5 else 1)
EOF

# --- export back to GPT-2's layout: the same tensors, bit for bit
"$B" export --checkpoint "$T/a/checkpoints" --out "$T/hf.safetensors" --layout hf-gpt2 >"$T/x.out" 2>&1; rc=$?
[ $rc -eq 0 ] && ok "export --layout hf-gpt2: exit 0" || { bad "export: exit $rc"; cat "$T/x.out"; }
has "$T/x.out" "GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4" "export prints GPT2Config"
"$PY" - "$T/model.safetensors" "$T/hf.safetensors" <<'EOF' && ok "export holds GPT-2's tensors bit for bit" || bad "export differs"
import json, struct, sys

def read(path):
    """{name: (dtype, shape, raw bytes)} and the metadata of a safetensors file"""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
                  for k, v in header.items()}

_, src = read(sys.argv[1])
meta, out = read(sys.argv[2])
want = {"transformer." + k: v for k, v in src.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
bad = sorted(set(want) ^ set(out)) + [k for k in want if k in out and want[k] != out[k]]
print("     %d tensors, metadata %s%s" % (len(out), meta, ", differ: %s" % bad[:4] if bad else ""))
sys.exit(1 if bad or meta.get("format") != "pt" else 0)
EOF

# --- re-import: the same weights, byte for byte
cp "$T/hf.safetensors" "$T/model.safetensors"
run b
[ $rc -eq 0 ] && cmp -s "$T/a/$ckpt" "$T/b/$ckpt" && ok "re-import of the export: the same checkpoint" ||
    { bad "re-import: exit $rc or other weights"; tail -3 "$T/b.err"; }
weights --prefix transformer. --lm-head
run c
[ $rc -eq 0 ] && cmp -s "$T/a/$ckpt" "$T/c/$ckpt" && ok "names prefixed transformer. and a tied lm_head.weight: the same" ||
    { bad "prefix + lm_head: exit $rc or other weights"; tail -3 "$T/c.err"; }

# --- the file does not fit: each tensor named
weights --drop h.1.mlp.c_fc.bias
run d
refused d "a missing tensor" "h.1.mlp.c_fc.bias \[256\]: not in the file" "fc1.1.bias" "GPT-2's layout"
weights --extra h.0.attn.rotary
run e
refused e "an extra tensor" "h.0.attn.rotary: in the file, not a tensor"
weights --reshape h.0.attn.c_attn.weight
run f
refused f "a mis-shaped tensor" "h.0.attn.c_attn.weight: \[65, 192\] in the file, \[64, 192\] expected" "stored transposed"

# --- the model does not fit GPT-2
weights
"$PY" - "$T" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1] + "/gpt.json"))
untied = json.loads(json.dumps(c))
del untied["model"]["layers"][-1]["tie"]
json.dump(untied, open(sys.argv[1] + "/untied.json", "w"))
del c["model"]["loss"]["classes"]
json.dump(c, open(sys.argv[1] + "/unpadded.json", "w"))
EOF
run g untied.json
refused g "an untied head" "not GPT-2's shape" "lm_head" "tied to wte"
run h unpadded.json
refused h "a padded vocabulary without loss.classes" "wte.weight: \[256, 64\] in the file, \[320, 64\] expected" "model.loss.classes"

"$B" export --checkpoint "$T/a/checkpoints" --out "$T/y.safetensors" --layout hf-gpt3 >/dev/null 2>"$T/y.err"; rc=$?
refused y "export --layout hf-gpt3" "expected ctrain, hf-gpt2 or hf-llama"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
