#!/bin/sh
# --dry-run's table of ZeRO stages and offload (core/train/fit.h, ct_fit_zero_table) against real
# runs on the capped device (CTRAIN_CAPPED_DEVICE set to the capacity the table was made for): a GPT
# of 2 blocks of width 128 (e2e_offload.sh's, bf16, 3 steps), its table for a 1.6 MiB device beside
# 12 MiB of host memory (--host-memory), then
#   - rows run for real (the NVMe rows swapping to a directory of the scratch dir): each row the
#     table says fits trains, its summary's planned device and host totals are the table's figures
#     and its device peak stays under the cap; each row that does not fit stops at start (exit 1,
#     "the memory plan needs");
#   - the largest model of a device-bound row (stage 2 + optimizer offload: model.layers.2's
#     "times") trains at its count and stops at start one block above; the largest of the host-bound
#     row (stage 3 + both offloads) plans within the host memory at its count and past it one above
#     (runs do not cap host memory: its summary's planned host bytes say it);
#   - a table with a larger device names the other cheapest row; a CPU run without a device says
#     how to get the table; --host-memory is refused without --dry-run and with a bad size.
# Usage: e2e_fit_offload.sh BUILD_DIR. Exit 77 (skipped) without /usr/share/common-licenses.
set -u
B=${1:-build}/ctrain
. test/lib_e2e.sh
. test/lib_models.sh
scratch_dir
licence_tokens "$B" "$T/tok"
mkdir -p "$T/swap"   # nvme_path of the NVMe rows
PY=/usr/bin/python3
CAP=1600KiB HOST=12MiB

cat >"$T/gpt.json" <<JSON
{
  "train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "gradient_clipping": 0.5,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 100000,
                        "stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 100000},
  "model": $(offload_gpt_model),
  "data": {"train": {"format": "tokens", "path": "$T/tok/train.bin", "seq_len": 32}},
  "checkpoint": {"enabled": false},
  "train": {"max_steps": 3, "seed": 7, "device": "cpu", "threads": 1}
}
JSON

# the table of a dry run (its stderr in FILE) as one row per line: stage|offload|device|host|fits|largest
table() {
    "$PY" - "$1" <<'EOF'
import re, sys
row = re.compile(r"^\s+([0-3])\s+(none|optimizer \+ params|optimizer|nvme \+ params|nvme)\s+stage [0-3]\s+(\d+(?:\.\d)? [KMGT]?i?B)"
                 r"\s+(\d+(?:\.\d)? [KMGT]?i?B)\s+(yes|no)\s+(.*)$")
for line in open(sys.argv[1]):
    m = row.match(line.rstrip("\n"))
    if m:
        print("|".join(m.groups()[:5] + (m.group(6).split("   <-")[0],)))
EOF
}
# zero STAGE OFFLOAD: the overrides of a row
zero() {
    case $2 in
    none) o=none p=none ;;
    optimizer) o=cpu p=none ;;
    "optimizer + params") o=cpu p=cpu ;;
    nvme) o=nvme p=none ;;
    *) o=nvme p=cpu ;;
    esac
    echo "--set zero_optimization.stage=$1 --set zero_optimization.offload_optimizer.device=$o --set zero_optimization.offload_param.device=$p"
    [ $o = nvme ] && echo "--set zero_optimization.offload_optimizer.nvme_path=$T/swap"
}
# run NAME CAP ARGS...: a run on the capped device of CAP (3 steps), its summary in $T/NAME.json
run() {
    name=$1 cap=$2
    shift 2
    CTRAIN_CAPPED_DEVICE=$cap "$B" --config "$T/gpt.json" --set train.run_dir="$T/$name" --summary "$T/$name.json" \
        "$@" >"$T/$name.log" 2>&1
}
# summary_says NAME DEVICE HOST CAP: the summary's planned totals, as the table prints bytes, are
# DEVICE and HOST, and its device peak is under CAP bytes
summary_says() {
    "$PY" - "$T/$1.json" "$2" "$3" "$4" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
def fmt(b):   # ct_fmt_bytes
    u = 0
    while b >= 1024 and u < 4:
        b /= 1024
        u += 1
    return ("%.1f %s" if u else "%.0f %s") % (b, ["B", "KiB", "MiB", "GiB", "TiB"][u])
dev, host = sum(s["planned_bytes_by_category"].values()), sum(s["planned_host_bytes_by_category"].values())
assert (fmt(dev), fmt(host)) == (sys.argv[2], sys.argv[3]), f"summary plans {fmt(dev)} / {fmt(host)}, table {sys.argv[2]} / {sys.argv[3]}"
assert 0 < s["peak_device_bytes"] <= int(sys.argv[4]), f"device peak {s['peak_device_bytes']} over the cap {sys.argv[4]}"
EOF
}
to_bytes() { "$PY" -c "import sys; n, u = sys.argv[1][:-3], sys.argv[1][-3:]; print(int(float(n) * {'KiB': 1024, 'MiB': 1 << 20}[u]))" "$1"; }

CTRAIN_CAPPED_DEVICE=$CAP "$B" --config "$T/gpt.json" --dry-run --host-memory $HOST >"$T/dry.out" 2>"$T/dry.err"
eq "dry run on the capped device: exit code" "$?" 0
has "$T/dry.err" "on a device of 1.6 MiB (the capped device, CTRAIN_CAPPED_DEVICE) beside 12.0 MiB of host memory (--host-memory)" \
    "the table names the device and the host memory it is for"
table "$T/dry.err" >"$T/rows"
eq "the table's rows" "$(wc -l <"$T/rows" | tr -d ' ')" 12
has "$T/dry.err" "<- this config" "the config's own row is marked"
has "$T/dry.err" "1  optimizer .*<- cheapest that fits" "the cheapest row that fits is marked (stage 1 with optimizer offload)"
has "$T/dry.err" "largest model: model.layers.2's \"times\" (2 here)" "the largest-model rule is said"
has "$T/dry.err" "(nvme: offload_optimizer \"nvme\", the fp32 master and optimizer state in swap files of up to" \
    "the NVMe rows' swap files are said"

# ---- rows run for real ----
capb=$(to_bytes $CAP)
yes=0 no=0
while IFS='|' read -r stage off dev host fits largest; do
    name="row_${stage}_$(echo "$off" | tr -d ' +')"
    # shellcheck disable=SC2046 # zero's overrides are words
    run "$name" $CAP $(zero "$stage" "$off")
    rc=$?
    if [ "$fits" = yes ]; then
        yes=$((yes + 1))
        [ $rc -eq 0 ] && ok "stage $stage, offload $off: fits, and trains" || bad "stage $stage, offload $off: fits by the table, exit $rc: $(tail -2 "$T/$name.log")"
        why=$(summary_says "$name" "$dev" "$host" "$capb" 2>&1) && ok "stage $stage, offload $off: the summary plans $dev / $host as the table, the device peak under the cap" ||
            bad "stage $stage, offload $off: $why"
    else
        no=$((no + 1))
        [ $rc -eq 1 ] && grep -q "the memory plan needs $dev but the capped device's memory" "$T/$name.log" &&
            ok "stage $stage, offload $off: does not fit, and stops at start needing $dev" ||
            bad "stage $stage, offload $off: does not fit by the table, exit $rc: $(grep -m1 error "$T/$name.log")"
    fi
done <"$T/rows"
[ $yes -ge 1 ] && [ $no -ge 4 ] && ok "$yes rows fit, $no do not" || bad "$yes rows fit, $no do not: the test needs both"

# ---- the largest model of a row, for real ----
# the row's largest count, from the table: "N blocks, ... (device|host)"
largest() { grep "^$1|$2|" "$T/rows" | cut -d'|' -f6 | sed -n 's/^\([0-9]*\) blocks\{0,1\}, .*(\(device\|host\))$/\1 \2/p'; }
set -- $(largest 2 optimizer)
n=${1:-0} bound=${2:-}
eq "stage 2 + optimizer offload: what bounds the largest model" "$bound" device
# shellcheck disable=SC2046
run big $CAP $(zero 2 optimizer) --set model.layers.2.times="$n" && ok "stage 2 + optimizer offload: the largest model, $n blocks, trains" ||
    bad "stage 2 + optimizer offload at $n blocks: exit $?: $(grep -m1 error "$T/big.log")"
# shellcheck disable=SC2046
run bigger $CAP $(zero 2 optimizer) --set model.layers.2.times=$((n + 1))
eq "stage 2 + optimizer offload at $((n + 1)) blocks: stopped at start" "$?" 1
set -- $(largest 3 "optimizer + params")
n=${1:-0} bound=${2:-}
eq "stage 3 + both offloads: what bounds the largest model" "$bound" host
for k in "$n" $((n + 1)); do
    # shellcheck disable=SC2046
    run "host$k" 64MiB $(zero 3 "optimizer + params") --set model.layers.2.times="$k" ||
        bad "stage 3 + both offloads at $k blocks: exit $?"
done
"$PY" - "$T/host$n.json" "$T/host$((n + 1)).json" "$(to_bytes $HOST)" <<'EOF' && ok "stage 3 + both offloads: $n blocks plan within the host memory, $((n + 1)) past it" || bad "the host bound of the largest model"
import json, sys
host = [sum(json.load(open(p))["planned_host_bytes_by_category"].values()) for p in sys.argv[1:3]]
assert host[0] <= int(sys.argv[3]) < host[1], f"{host} against {sys.argv[3]}"
EOF

# ---- another device, the CPU, the options ----
CTRAIN_CAPPED_DEVICE=16MiB "$B" --config "$T/gpt.json" --dry-run --host-memory 1GiB >/dev/null 2>"$T/dry16.err"
has "$T/dry16.err" "0  none .*yes .*<- cheapest that fits" "on a 16 MiB device stage 0 without offload is the cheapest that fits"
(unset CTRAIN_CAPPED_DEVICE; "$B" --config "$T/gpt.json" --dry-run >/dev/null 2>"$T/cpu.err")
has "$T/cpu.err" "ZeRO stage and offload: planned for a device (--device-memory SIZE" "on the CPU the dry run says how to plan for a device"
(unset CTRAIN_CAPPED_DEVICE; "$B" --config "$T/gpt.json" --dry-run --device-memory 2MiB >/dev/null 2>"$T/dm.err")
has "$T/dm.err" "on a device of 2.0 MiB (--device-memory) beside .* (MemAvailable now)" "--device-memory plans the table for a device beside the host's available memory"
"$B" --config "$T/gpt.json" --host-memory 1GiB >/dev/null 2>"$T/hm.err"
eq "--host-memory without --dry-run: exit code" "$?" 2
has "$T/hm.err" "needs --dry-run" "the message says what it is for"
"$B" --config "$T/gpt.json" --dry-run --host-memory 12 >/dev/null 2>"$T/hm.err"
eq "--host-memory 12: exit code" "$?" 2
has "$T/hm.err" "\-\-host-memory: \"12\" has no unit" "the message names the option and the problem"

[ $fails -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
