#!/bin/sh
# Resource limits (ulimit -v, -n, -f): a run that does not fit its address-space limit (ulimit -v) fails at start with
# exit 1 and a message naming the limit, instead of hanging in OpenBLAS's buffer allocation (which
# retries a failing mmap forever, and made exit hang joining its thread); a limit too small to map
# OpenBLAS itself is an error message too (linked, its constructor raised SIGINT before main: exit
# 130 as if interrupted); a run that fits trains.
# Each run has a watchdog: a hang is a failure here, not a stuck CI.
# Usage: e2e_limits.sh BUILD_DIR. Fails, naming it, when the Fashion-MNIST package is missing (make deps
# installs it).
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
need_fmnist
scratch_dir

# limited OPTION VALUE CODE DESCRIPTION: train the MLP a few steps under ulimit OPTION VALUE (-v
# KB of address space, -n open files; 60 s at most).
limited() {
    # redirected outside: under ulimit -n 5 the shell itself could not move descriptors past 5
    (ulimit "$1" "$2" && exec timeout -s KILL 60 "$B" --quiet --config configs/fmnist_mlp.json \
        --set train.max_steps=3 --set data.eval.limit=100 --set train.run_dir="$T/run") >/dev/null 2>"$T/err"
    rc=$?
    if [ "$rc" -eq "$3" ]; then ok "$4"; else bad "$4 (exit $rc, expected $3)"; sed 's/^/     /' "$T/err" | head -4; fi
}
limited -v 500000 1 "ulimit -v 500000: exit 1 at start"
has "$T/err" "of address space but the limit (ulimit -v) is 488.3 MiB" "the message names the limit"
has "$T/err" "OpenBLAS's GEMM buffers" "the message says where the memory goes"
# its parts add up to its total (the headroom was left out: 315.6 + 11.4 + 256.0 MiB of "647.0")
/usr/bin/python3 - "$T/err" <<'EOF' && ok "the message's parts add up to its total" || bad "the parts do not add up: $(head -2 "$T/err")"
import re, sys
unit = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
text = open(sys.argv[1]).read()
v, u = re.search(r"needs about ([0-9.]+) (KiB|MiB|GiB)", text).groups()
parts = re.sub(r"\([^)]*\)", "", text.splitlines()[1])   # the parenthesised notes are not parts
got = sum(float(x) * unit[y] for x, y in re.findall(r"([0-9.]+) (KiB|MiB|GiB)", parts))
sys.exit(0 if abs(got - float(v) * unit[u]) <= 0.2 else 1)
EOF
limited -v 100000 1 "ulimit -v 100000: exit 1, no hang at exit"
has "$T/err" "out of memory\|failed to map" "the message says what ran out"
limited -v 50000 1 "ulimit -v 50000: exit 1, not 130 (OpenBLAS is loaded after main, not before)"
has "$T/err" "cannot load OpenBLAS: .*failed to map" "the message says OpenBLAS could not be mapped"
has "$T/err" "ulimit -v for memory" "and names the likely cause"
# Too few open files is the process's limit, not bad input: exit 1 (it was 2 for the config, 3 for
# a data file), naming what could not be opened.
limited -n 5 1 "ulimit -n 5: the config cannot be opened: exit 1"
has "$T/err" "fmnist_mlp.json: Too many open files" "the message names the config and the reason"
limited -n 6 1 "ulimit -n 6: OpenBLAS cannot be opened: exit 1"
has "$T/err" "ulimit -n for open files" "the message names the limit"
limited -v 4000000 0 "ulimit -v 4000000: the run fits and trains"
# A write past the file-size limit (ulimit -f, in 512-byte blocks in sh): SIGXFSZ used to end the run
# without a word (exit 153); the write fails instead, the error names the file and the limit, exit 1
# with the summary. 512 bytes: run_dir/config.json; 50 KiB: the first checkpoint (2.7 MB of weights).
fsize() {
    (ulimit -f "$1" && exec timeout -s KILL 60 "$B" --quiet --config configs/fmnist_mlp.json \
        --set train.max_steps=3 --set data.eval.limit=100 --set train.run_dir="$T/run-f$1") >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" -eq 1 ]; then ok "ulimit -f $1: exit 1"; else bad "ulimit -f $1: exit $rc, expected 1"; sed 's/^/     /' "$T/err" | head -4; fi
    has "$T/err" "$2: write failed: File too large" "ulimit -f $1: the error names $2"
    has "$T/err" "file-size limit of this process (ulimit -f) is $3 bytes" "ulimit -f $1: and the limit"
    has "$T/out" '^{"status":"error"' "ulimit -f $1: the summary line is written"
}
# Memory a data file asks for (a tar member of 3 GiB, sparse here) that the process cannot have:
# exit 1 naming the file, the member and the bytes, with the summary (it was ct_fatal naming a
# source line, webdataset.c, and no summary).
/usr/bin/python3 - "$T/big.tar" <<'EOF'
import sys, tarfile
size = 3 << 30
with open(sys.argv[1], "wb") as f:
    head = tarfile.TarInfo("s0.png")
    head.size = size
    f.write(head.tobuf(tarfile.USTAR_FORMAT))
    f.seek(512 + size)
    label = tarfile.TarInfo("s0.cls")
    label.size = 1
    f.write(label.tobuf(tarfile.USTAR_FORMAT) + b"1" + bytes(511 + 1024))
EOF
cat >"$T/big.json" <<EOF
{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {}},
 "model": {"input": [1, 4, 4], "layers": [{"type": "flatten"}, {"type": "linear", "out": 2}],
           "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "webdataset", "urls": "big.tar"}}, "train": {"max_steps": 1}}
EOF
(ulimit -v 2000000 && exec timeout -s KILL 60 "$B" --quiet --config "$T/big.json" --set train.run_dir="$T/run-big") \
    >"$T/out" 2>"$T/err"
eq "a 3 GiB tar member under ulimit -v 2000000: exit 1" "$?" 1
has "$T/err" "out of host memory: 3221225473 bytes (3.0 GiB) for .*big.tar: member s0.png (3221225472 bytes)" \
    "the message names the file, the member and the bytes"
has "$T/out" '^{"status":"error"' "the summary line is written"
fsize 1 "run-f1/config.json" 512
fsize 100 "model.safetensors" 51200

[ $fails -eq 0 ] && echo "all passed" || echo "$fails failed"
[ $fails -eq 0 ]
