#!/bin/sh
# End-to-end: how a run ends when its surroundings go away or ask it to stop, on a random CSV data
# set (64 features, 4 classes) and an MLP whose steps take a good fraction of a second:
#  - the reader of its log exits (ctrain ... 2>&1 | head -1): no death by SIGPIPE, training goes
#    on quietly, saves, writes --summary and exits 0;
#  - SIGHUP (the terminal closed) is handled like SIGTERM: finish the step, save, exit 129;
#  - two SIGINTs: the first is acknowledged at once, the second exits 130 without saving, with one
#    line saying so and the summary (status interrupted) on stdout and in --summary.
# Usage: e2e_signals.sh BUILD_DIR
set -u
B=${1:-build}/ctrain
[ -x "$B" ] || { echo "FAIL: $B missing (run make)"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. test/lib_e2e.sh
# status FILE STATUS DESCRIPTION: the summary line in FILE has that status
status() { has "$1" "^{\"status\":\"$2\"" "$3"; }
# wait_for FILE PATTERN: until FILE has a line matching PATTERN (10 s at most); 1 when it never did
wait_for() {
    n=0
    while ! grep -q -- "$2" "$1" 2>/dev/null; do
        n=$((n + 1))
        [ $n -gt 500 ] && return 1
        sleep 0.02
    done
    return 0
}

random_csv "$T/train.csv" 2048 64 4 5
cat > "$T/c.json" <<'JSON'
{"train_batch_size": 256, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
 "model": {"input": [64], "layers": [{"type": "linear", "name": "fc1", "out": 2048}, {"type": "relu", "name": "r1"},
           {"type": "linear", "name": "fc2", "out": 2048}, {"type": "relu", "name": "r2"},
           {"type": "linear", "name": "fc3", "out": 4}], "loss": {"type": "cross_entropy"}},
 "data": {"train": {"format": "csv", "path": "train.csv"}},
 "train": {"epochs": 50, "seed": 3, "device": "cpu", "threads": 1}}
JSON
C="$T/c.json"

# --- the log's reader goes away: 6 steps of progress lines go to a closed pipe
{ "$B" --config "$C" --set train.max_steps=6 --set train.run_dir=\""$T/pipe"\" --summary "$T/pipe.json"
  echo $? >"$T/pipe.rc"; } 2>&1 | head -1 >"$T/pipe.first"
has "$T/pipe.first" "^ctrain [0-9]" "head -1 got the first line"
rc=$(cat "$T/pipe.rc")
[ "$rc" = 0 ] && ok "closed log pipe: exit 0" || bad "closed log pipe: exit $rc (141 is death by SIGPIPE)"
status "$T/pipe.json" ok "closed log pipe: --summary written"
has "$T/pipe.json" '"steps":6,' "closed log pipe: every step trained"
[ -f "$T/pipe/checkpoints/global_step6/model.safetensors" ] && ok "closed log pipe: final checkpoint saved" \
    || bad "closed log pipe: no final checkpoint"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
