#!/bin/sh
# Token ids past the model's embedding table are a data error found by the loader (issue 12, B7):
# no kernel checks them (on a GPU an id >= vocab reads outside the table). Byte tokens (vocabulary
# 256 in the file's header) feed a model whose embedding has "vocab": 100 but whose head predicts
# all 256 bytes, so only the embedding's bound can catch byte 'z' (122). Exit 3, naming the file,
# the record, the position and the id, with a hint; data.skip_corrupt skips the windows instead.
# Usage: sh test/e2e_token_vocab.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
scratch_dir
# 64 windows of 16 bytes from 'a'..'c', with one 'z' as the 6th token (position 5) of window 3.
awk 'BEGIN { for (i = 0; i < 1040; i++) printf "%c", (i == 3 * 16 + 5) ? "z" : substr("abc", i % 3 + 1, 1) }' >"$T/text"
sh datasets/text_tokens.sh --eval-fraction 0 --ctrain "$B" "$T/d" "$T/text" >"$T/log" 2>&1 || { cat "$T/log"; exit 1; }
cat >"$T/lm.json" <<'JSON'
{"train_batch_size": 4,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "model": {"input": [16], "layers": [{"type": "embedding", "vocab": 100, "dim": 8},
                                     {"type": "linear", "out": 256}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "tokens", "path": "d/tokens.bin", "seq_len": 16}, "shuffle": false, "workers": 1},
 "train": {"max_steps": 16, "seed": 1, "device": "cpu", "threads": 1}}
JSON
"$B" --quiet --config "$T/lm.json" --set train.run_dir="$T/r1" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 3 ] && ok "an id >= the embedding's vocab exits 3" || { bad "exit $rc, expected 3"; sed 's/^/     /' "$T/err" | head -5; }
has "$T/err" "tokens.bin: record 3, position 5: token id 122 is outside the model's embedding vocabulary of 100" \
    "the error names the file, record, position and id"
has "$T/err" 'set the embedding.s "vocab"' "the error has a hint"
"$B" --quiet --config "$T/lm.json" --set train.run_dir="$T/r2" --set data.skip_corrupt=true \
    --summary "$T/s.json" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok "data.skip_corrupt skips the window" || { bad "skip_corrupt: exit $rc"; sed 's/^/     /' "$T/err" | head -5; }
has "$T/s.json" '"skipped_records": *1' "one record skipped"
# Every id inside the table: the same model trains (the check refuses nothing else).
sed 's/"vocab": 100/"vocab": 256/' "$T/lm.json" >"$T/ok.json"
"$B" --quiet --config "$T/ok.json" --set train.run_dir="$T/r3" >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok "with vocab 256 the model trains" || { bad "vocab 256: exit $rc"; sed 's/^/     /' "$T/err" | head -5; }
exit $fails
