#!/bin/sh
# e2e_hf_tokenize.sh: datasets/hf_tokenize.py, text tokenized with a model's tokenizer.json into
# ctrain token files (issue #31). A small BPE tokenizer is trained here with the `tokenizers`
# package and saved as tokenizer.json; two text files are tokenized with an eval split:
#  - the header (magic, width, count, vocabulary, CRC) is what docs/formats.md says, and the ids,
#    decoded by the tokenizer, give back the texts with the separator between them;
#  - a Llama trains on them for 3 steps (the vocabulary from the header);
#  - a file that is not UTF-8 and a tokenizer without an end-of-text token are errors naming them.
# Usage: sh test/e2e_hf_tokenize.sh BUILD_DIR. Fails, naming it, when CT_HF_PYTHON (default the tests'
# venv, $CT_TEST_VENV or .venv) cannot import tokenizers (make deps installs it).
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
HFPY=${CT_HF_PYTHON:-${CT_TEST_VENV:-.venv}/bin/python}
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
{ [ -x "$HFPY" ] && "$HFPY" -c "import tokenizers" 2>/dev/null; } ||
    missing_dep "python module tokenizers in $HFPY (datasets/requirements-test.txt)"
scratch_dir
for f in /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0; do cat "$f"; done >"$T/corpus.txt"
head -c 20000 /usr/share/common-licenses/GPL-3 >"$T/a.txt"
head -c 12000 /usr/share/common-licenses/Apache-2.0 >"$T/b.txt"
"$HFPY" - "$T" <<'PYEOF' || bad "training a tokenizer"
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.train([sys.argv[1] + "/corpus.txt"], trainers.BpeTrainer(vocab_size=300, special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t.save(sys.argv[1] + "/tokenizer.json")
t2 = Tokenizer(models.BPE())
t2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t2.train([sys.argv[1] + "/corpus.txt"], trainers.BpeTrainer(vocab_size=270, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
t2.save(sys.argv[1] + "/no_eos.json")
PYEOF
"$HFPY" datasets/hf_tokenize.py --tokenizer "$T/tokenizer.json" "$T/a.txt" "$T/b.txt" --out "$T/tok" \
    --eval-fraction 0.1 >"$T/tok.out" 2>&1 && ok "hf_tokenize.py: exit 0" || { bad "hf_tokenize.py"; cat "$T/tok.out"; }
has "$T/tok.out" "tokenized 2 file(s) into .* tokens (vocabulary 300, 2 bytes per token)" "it says what it wrote"
"$HFPY" - "$T" <<'PYEOF' && ok "header as documented; the ids decode back to the texts" || bad "header or round trip"
import struct, sys, zlib
from tokenizers import Tokenizer
d = sys.argv[1]
ids = []
for name in ("train.bin", "eval.bin"):
    blob = open("%s/tok/%s" % (d, name), "rb").read()
    magic, version, width, n, vocab, crc = struct.unpack("<8sIIQII", blob[:32])
    assert magic == b"CTTOKENS" and version == 1 and width == 2 and vocab == 300, (magic, version, width, vocab)
    assert crc == zlib.crc32(blob[:28]) and len(blob) == 32 + 2 * n, name
    ids += struct.unpack("<%dH" % n, blob[32:])
t = Tokenizer.from_file(d + "/tokenizer.json")
eos = t.token_to_id("</s>")
cut = ids.index(eos)
want = [open(d + "/a.txt").read(), open(d + "/b.txt").read()]
got = [t.decode(ids[:cut]), t.decode(ids[cut + 1:-1])]
print("     %d tokens, separator at %d, last %d" % (len(ids), cut, ids[-1]))
sys.exit(0 if got == want and ids[-1] == eos else 1)
PYEOF
cat >"$T/c.json" <<EOF
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.003}},
 "model": {"input": [32], "layers": [
   {"type": "embedding", "name": "wte", "vocab": 300, "dim": 32},
   {"type": "repeat", "times": 2, "layers": [{"type": "llama_block", "heads": 4, "kv_heads": 2, "intermediate": 64}]},
   {"type": "rmsnorm", "name": "norm"}, {"type": "linear", "name": "head", "out": 300, "bias": false}],
   "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "tokens", "path": "tok/train.bin", "seq_len": 32},
          "eval": {"format": "tokens", "path": "tok/eval.bin", "seq_len": 32}},
 "train": {"max_steps": 3, "seed": 1, "device": "cpu", "threads": 1}}
EOF
"$B" --config "$T/c.json" --set train.run_dir=\""$T/run"\" >/dev/null 2>"$T/run.err" && ok "a Llama trains on them" ||
    { bad "training: exit $?"; tail -3 "$T/run.err"; }
printf 'caf\351\n' >"$T/latin1.txt"
"$HFPY" datasets/hf_tokenize.py --tokenizer "$T/tokenizer.json" "$T/latin1.txt" --out "$T/x" 2>"$T/x.err"; rc=$?
[ $rc -eq 1 ] && has "$T/x.err" "latin1.txt: not UTF-8 text (byte 3)" "text that is not UTF-8: exit 1 naming the file" ||
    bad "not UTF-8: exit $rc"
"$HFPY" datasets/hf_tokenize.py --tokenizer "$T/no_eos.json" "$T/a.txt" --out "$T/y" 2>"$T/y.err"; rc=$?
[ $rc -eq 2 ] && has "$T/y.err" "none of the end-of-text tokens" "no end-of-text token: exit 2 asking for --separator" ||
    bad "no separator: exit $rc"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
