#!/bin/sh
# e2e_llmc_shards.sh: a set of llm.c shards as one data set (docs/formats.md, "Several files").
# Byte tokens of random text, packed into one ctrain file, and the same tokens cut at uneven places
# into 3 llm.c shards (a 1024-byte header of int32 magic 20240520, version 1, count; uint16
# tokens) written by Python's standard library, with an eval shard beside them the glob must not
# take. A small Llama trained 6 steps (shuffled) on:
#  - the glob "shards/train_*.bin" and the list of the 3 shards: the weights bit for bit those of
#    the run on the one file (one stream: windows run across the shard boundaries);
#  - the same on 2 CPU ranks (mpirun, ZeRO-2): each rank's samples of the glob, the checkpoint bit
#    for bit the 2-rank run's on the one file;
#  - a resume after a shard's tokens changed (same size): --strict-resume refuses, exit 3, as the
#    fingerprint covers every shard;
#  - a token id past the model's embedding in the last shard: exit 3 naming that shard, the token
#    and its byte offset there;
#  - a glob that matches nothing: exit 3 naming the pattern; a bad header in the middle shard:
#    exit 3 naming the shard and the byte.
# Usage: sh test/e2e_llmc_shards.sh BUILD_DIR
cd "$(dirname "$0")/.." || exit 2
. test/lib_e2e.sh
PY=/usr/bin/python3
in_scratch "${1:-build}"

awk 'BEGIN { srand(5); for (i = 0; i < 6000; i++) printf "%c", 97 + int(rand() * 26) }' >text.txt
"$B" pack --from text text.txt --out one >/dev/null 2>&1 || { bad "pack failed"; exit 1; }
mkdir shards
"$PY" - one/tokens.bin shards <<'PYEOF' || { bad "writing the shards failed"; exit 1; }
import struct, sys
src, out = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()[32:]          # ctrain's 32-byte header off: uint16 tokens
n = len(data) // 2
cuts = [0, 1777, 1777 + 2500, n]            # uneven: windows of 16 + 1 cross both boundaries
def shard(path, tokens):
    header = struct.pack("<3i", 20240520, 1, len(tokens) // 2) + bytes(1024 - 12)
    open(path, "wb").write(header + tokens)
for k in range(3):
    shard("%s/train_%06d.bin" % (out, k), data[2 * cuts[k]:2 * cuts[k + 1]])
shard("%s/val_000000.bin" % out, data[:200])
PYEOF

cat >base.json <<'EOF'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
 "model": {"input": [16], "layers": [
   {"type": "embedding", "name": "wte", "vocab": 256, "dim": 16},
   {"type": "repeat", "times": 2, "layers": [
     {"type": "llama_block", "heads": 4, "kv_heads": 2, "intermediate": 24, "rope_theta": 10000}]},
   {"type": "rmsnorm", "name": "norm"},
   {"type": "linear", "name": "head", "out": 256, "bias": false}],
   "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "tokens", "path": "one/tokens.bin", "seq_len": 16}, "shuffle": true},
 "train": {"max_steps": 6, "seed": 7, "device": "cpu", "threads": 1, "save_interval": 6}}
EOF
# run NAME PATH [ARGS...]: base.json on data.train.path PATH (JSON) into NAME; exit code in rc
run() {
    n=$1 p=$2
    shift 2
    "$B" --config base.json --set train.run_dir=\""$T/$n"\" --set data.train.path="$p" --set data.train.vocab=256 \
        "$@" >"$n.out" 2>"$n.err"
    rc=$?
}
weights() { find "$T/$1" -path "*global_step$2/model.safetensors"; }

"$B" --config base.json --set train.run_dir=\""$T/one"\" >one.out 2>one.err || { bad "the one-file run: exit $?"; tail -3 one.err; }
run glob '"shards/train_*.bin"'
eq "the glob's run: exit" "$rc" 0
has glob.err "train_\*.bin (3 files)" "the start line names the glob and its 3 files"
cmp -s "$(weights one 6)" "$(weights glob 6)" && ok "the glob of 3 shards: the one file's weights bit for bit" ||
    { bad "the glob of 3 shards: other weights"; tail -3 glob.err; }
run list '["shards/train_000000.bin", "shards/train_000001.bin", "shards/train_000002.bin"]'
eq "the list's run: exit" "$rc" 0
cmp -s "$(weights one 6)" "$(weights list 6)" && ok "the list of 3 shards: the one file's weights bit for bit" ||
    bad "the list of 3 shards: other weights"

# 2 CPU ranks (ZeRO-2) reading their samples of the glob: the 2-rank run on the one file, bit for bit
if command -v mpirun >/dev/null 2>&1; then
    for d in one glob; do
        p='"one/tokens.bin"'
        [ $d = glob ] && p='"shards/train_*.bin"'
        mpirun --allow-run-as-root --oversubscribe -np 2 "$B" --config base.json --set zero_optimization.stage=2 \
            --set train.run_dir=\""$T/z$d"\" --set data.train.path="$p" --set data.train.vocab=256 >"z$d.out" 2>"z$d.err" ||
            { bad "ZeRO-2 on 2 ranks, $d: exit $?"; tail -3 "z$d.err"; }
    done
    zw() { find "$T/$1" -path "*global_step6*" -name "*.safetensors" | sort | xargs cat >"$1.bin"; }
    zw zone && zw zglob
    [ -s zglob.bin ] && cmp -s zone.bin zglob.bin &&
        ok "ZeRO-2 on 2 ranks: the glob's checkpoint = the one file's, bit for bit" || bad "ZeRO-2 on 2 ranks: other weights"
else
    echo "skip ZeRO on 2 ranks: mpirun not installed"
fi

# a resume on shards of which one changed (the same size): the fingerprint sees it
run part '"shards/train_*.bin"' --set train.max_steps=3 --set train.save_interval=3
eq "3 steps on the glob: exit" "$rc" 0
cp -r "$T/part" "$T/part2"
"$PY" - shards/train_000002.bin <<'PYEOF'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[1024] = 98 if b[1024] != 98 else 99      # the last shard's first token
open(sys.argv[1], "wb").write(bytes(b))
PYEOF
run part2 '"shards/train_*.bin"' --resume auto --strict-resume
eq "--strict-resume after a shard changed: exit" "$rc" 3
has part2.err "train_\*.bin (3 files)) changed since .*content differs" "the error says the shards' content changed"

# an id past the model's embedding (the loader's check): the error names the shard and the offset
mkdir ids
"$PY" - ids <<'PYEOF'
import struct, sys
for k, n in enumerate((100, 60, 120)):
    tokens = [(7 * i + k) % 90 for i in range(n)]
    if k == 2:
        tokens[10] = 150                    # stream token 170: record 10, position 10 at seq_len 16
    body = struct.pack("<%dH" % n, *tokens)
    open("%s/train_%06d.bin" % (sys.argv[1], k), "wb").write(struct.pack("<3i", 20240520, 1, n) + bytes(1012) + body)
PYEOF
sed 's/"vocab": 256, "dim": 16/"vocab": 100, "dim": 16/' base.json >ids.json
"$B" --config ids.json --set train.run_dir=\""$T/ids"\" --set data.train.path='"ids/train_*.bin"' --set data.train.vocab=256 \
    --set data.shuffle=false >ids.out 2>ids.err
eq "an id past the embedding in the last shard: exit" "$?" 3
has ids.err "record 10, position 10 (.*ids/train_000002.bin, token 10, byte offset 1044): token id 150 is outside" \
    "the error names the shard, the token and its byte offset"

# errors: an empty glob, a bad header in the middle shard
run empty '"shards/train_*.tok"'
eq "a glob that matches nothing: exit" "$rc" 3
has empty.err 'data.train.path: ".*shards/train_\*.tok" matches no file' "the error names the pattern"
"$PY" - shards/train_000001.bin <<'PYEOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
b[4:8] = struct.pack("<i", 3)              # version 3
open(sys.argv[1], "wb").write(bytes(b))
PYEOF
run badhdr '"shards/train_*.bin"'
eq "a bad header in the middle shard: exit" "$rc" 3
has badhdr.err "shards/train_000001.bin: llm.c version 3 (at byte 4)" "the error names the shard and the byte"

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
