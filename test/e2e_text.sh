#!/bin/sh
# e2e_text.sh: byte-level token data from text (issue 13): datasets/text_tokens.sh (what
# `make data-text` runs) joins the files in name order, skips gzip'd files and directories, splits
# off the last fraction as eval.bin; the files it writes open as the tokens format with the
# expected window counts (bench-data reads one epoch of each), and a model trains on them with an
# eval set. Then the same on the licence texts `make data-text` reads (/usr/share/common-licenses).
# Usage: sh test/e2e_text.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
B=${1:-build}/ctrain
scratch_dir

# Two random text files named in reverse order (the result must follow the names), a gzip'd file
# that does not end in .gz (found by its magic) and a directory: the last two are skipped.
random_text() {
    awk -v n="$2" -v seed="$3" 'BEGIN { srand(seed); for (i = 0; i < n; i++) printf "%c", (rand() < 0.1) ? 10 : 32 + int(rand() * 95) }' >"$1"
}
random_text "$T/b.txt" 5003 7
random_text "$T/a.txt" 1234 8
printf '\037\213\010\000binary' >"$T/notes.txt"
mkdir "$T/adir"
sh datasets/text_tokens.sh --ctrain "$B" --eval-fraction 0.1 "$T/out" "$T/b.txt" "$T/notes.txt" "$T/adir" \
    "$T/a.txt" >"$T/log" 2>"$T/err"
rc=$?
[ $rc -eq 0 ] && ok "text_tokens.sh exits 0" || { bad "text_tokens.sh exit $rc"; cat "$T/err"; }
has "$T/err" "skipping $T/notes.txt: gzip'd" "a gzip'd file is skipped, named"
has "$T/err" "skipping $T/adir: not a readable regular file" "a directory is skipped, named"
total=$(cat "$T/a.txt" "$T/b.txt" | wc -c)
n_eval=$(awk -v t="$total" 'BEGIN { printf "%d", t * 0.1 }')
n_train=$((total - n_eval))
has "$T/log" "packed $total byte-level tokens (vocabulary 256) from 2 file(s): $n_train into $T/out/train.bin, $n_eval into $T/out/eval.bin" "pack prints the sizes"
# The header is 32 bytes, then 2 bytes a token.
[ "$(wc -c <"$T/out/train.bin")" -eq $((32 + 2 * n_train)) ] && [ "$(wc -c <"$T/out/eval.bin")" -eq $((32 + 2 * n_eval)) ] &&
    ok "train.bin and eval.bin hold $n_train and $n_eval tokens" || bad "file sizes: $(wc -c "$T/out/train.bin" "$T/out/eval.bin")"
# eval.bin is the end of b.txt (the last file by name), token for byte
if [ "$(od -A n -v -t u2 -j 32 "$T/out/eval.bin" | tr -s ' \n' '\n\n' | sed '/^$/d')" = \
     "$(tail -c "$n_eval" "$T/b.txt" | od -A n -v -t u1 | tr -s ' \n' '\n\n' | sed '/^$/d')" ]; then
    ok "eval.bin holds the last bytes of the last file by name"
else
    bad "eval.bin is not the end of b.txt"
fi

# cfg SEQ_LEN TRAIN EVAL: a byte-level model config reading the two files
cfg() {
    cat >"$T/lm.json" <<JSON
{"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
 "model": {"input": [$1], "loss": {"type": "cross_entropy"}, "layers": [
   {"type": "embedding", "name": "wte", "vocab": 256, "dim": 8},
   {"type": "linear", "name": "head", "out": 256, "bias": false, "tie": "wte.weight"}]},
 "data": {"drop_last": false, "train": {"format": "tokens", "path": "$2", "seq_len": $1},
          "eval": {"format": "tokens", "path": "$3", "seq_len": $1}},
 "train": {"max_steps": 2, "device": "cpu", "run_dir": "$T/run"}}
JSON
}
# windows FILE SEQ_LEN: the samples one epoch of bench-data reads
windows() {
    sed -n 's/.*"samples": \([0-9]*\).*/\1/p' "$1"
}
cfg 16 "$T/out/train.bin" "$T/out/eval.bin"
"$B" bench-data --config "$T/lm.json" >"$T/bt" 2>"$T/err" && "$B" bench-data --config "$T/lm.json" --eval >"$T/be" 2>>"$T/err"
[ "$(windows "$T/bt")" = $(((n_train - 1) / 16)) ] && [ "$(windows "$T/be")" = $(((n_eval - 1) / 16)) ] &&
    ok "train.bin and eval.bin open as tokens: $(((n_train - 1) / 16)) and $(((n_eval - 1) / 16)) windows of 16" ||
    bad "window counts: $(cat "$T/bt" "$T/be" "$T/err")"
if "$B" --quiet --config "$T/lm.json" --summary "$T/s.json" >/dev/null 2>"$T/err" &&
    grep -q '"status":"ok"' "$T/s.json" && ! grep -q '"eval_loss":null' "$T/s.json"; then
    ok "a byte-level model trains and evaluates on them"
else
    bad "training on them: $(cat "$T/s.json" 2>/dev/null) $(tail -3 "$T/err")"
fi

# What `make data-text` reads, its licence half (the copyright files vary with what is installed).
set -- /usr/share/common-licenses/*
if [ -f "$1" ]; then
    sh datasets/text_tokens.sh --ctrain "$B" "$T/lic" "$@" >"$T/log" 2>"$T/err" || bad "text_tokens.sh on $*: $(cat "$T/err")"
    total=$(cat "$@" | wc -c)
    n_eval=$(awk -v t="$total" 'BEGIN { printf "%d", t * 0.05 }')
    cfg 64 "$T/lic/train.bin" "$T/lic/eval.bin"
    "$B" bench-data --config "$T/lm.json" >"$T/bt" 2>"$T/err" && "$B" bench-data --config "$T/lm.json" --eval >"$T/be" 2>>"$T/err"
    [ "$(windows "$T/bt")" = $(((total - n_eval - 1) / 64)) ] && [ "$(windows "$T/be")" = $(((n_eval - 1) / 64)) ] &&
        ok "/usr/share/common-licenses: $total bytes, $(((n_eval - 1) / 64)) eval windows of 64 (5%)" ||
        bad "licence window counts: $(cat "$T/log" "$T/bt" "$T/be" "$T/err")"
    # accuracy of a sequence model counts every position: a share of the eval set's labels, not of
    # its samples (it read 64 x the share, e.g. 2213%, when divided by samples)
    rm -rf "$T/run"
    if "$B" --quiet --config "$T/lm.json" --summary "$T/s.json" >/dev/null 2>"$T/err"; then
        acc=$(sed -n 's/.*"eval_accuracy":\([0-9.e+-]*\).*/\1/p' "$T/s.json")
        awk -v a="$acc" 'BEGIN { exit !(a > 0 && a <= 1) }' && ok "eval accuracy over positions: $acc" ||
            bad "eval_accuracy $acc is not a share of the labels: $(cat "$T/s.json")"
    else
        bad "training on the licences: $(tail -3 "$T/err")"
    fi
else
    bad "missing dependency: /usr/share/common-licenses is empty (Debian's base-files; make deps installs it)"
fi

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
