#!/bin/sh
# End-to-end: how a run ends when its surroundings go away or ask it to stop, on a random CSV data
# set (64 features, 4 classes) and an MLP whose steps take a good fraction of a second:
#  - the reader of its log exits (ctrain ... 2>&1 | head -1): no death by SIGPIPE, training goes
#    on quietly, saves, writes --summary and exits 0;
#  - SIGHUP (the terminal closed) is handled like SIGTERM: finish the step, save, exit 129; under
#    nohup it stays ignored;
#  - two SIGINTs: the first is acknowledged at once, the second exits 130 without saving, with one
#    line saying so and the summary (status interrupted) on stdout and in --summary;
#  - a signal before the first step (the set-up) exits at once with 128 + the signal.
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

# start NAME: a run in the background (50 epochs: far longer than the test), its pid in $pid.
# SIGHUP back to its default first: a suite started under nohup passes SIGHUP ignored to every
# child, and ctrain (rightly) keeps it ignored, which is the nohup case below, not this one.
start() {
    env --default-signal=HUP "$B" --config "$C" --set train.run_dir=\""$T/$1"\" --summary "$T/$1.json" >"$T/$1.out" 2>"$T/$1.err" &
    pid=$!
}
# steps FILE: the "steps" of the summary line in FILE
steps() { sed -n 's/.*"steps":\([0-9]*\),.*/\1/p' "$1"; }

# --- SIGHUP (the terminal closed) stops the run as SIGTERM does: finish the step, save, exit 129
start hup
wait_for "$T/hup.err" "^step 1/" || bad "SIGHUP: the run never reached step 1"
kill -HUP $pid
wait $pid
rc=$?
[ $rc -eq 129 ] && ok "SIGHUP: exit 129" || bad "SIGHUP: exit $rc, expected 129"
has "$T/hup.err" "interrupted by SIGHUP after step [0-9]*; saved .*global_step" "SIGHUP: the step finished and saved"
status "$T/hup.json" interrupted "SIGHUP: summary status interrupted"
n=$(steps "$T/hup.json")
[ -n "$n" ] && [ -f "$T/hup/checkpoints/global_step$n/model.safetensors" ] && ok "SIGHUP: checkpoint at step $n" \
    || bad "SIGHUP: no checkpoint at the summary's step ${n:-?}"

# --- under nohup (SIGHUP ignored when ctrain starts) SIGHUP stays ignored; SIGTERM still stops it
( trap '' HUP; exec "$B" --config "$C" --set train.run_dir=\""$T/nohup"\" >"$T/nohup.out" 2>"$T/nohup.err" ) &
pid=$!
wait_for "$T/nohup.err" "^step 1/" || bad "nohup: the run never reached step 1"
kill -HUP $pid
n=$(grep -c "^step " "$T/nohup.err")
wait_for "$T/nohup.err" "^step $((n + 2))/" && ok "nohup: SIGHUP ignored, training goes on" || bad "nohup: no step after SIGHUP"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] && ok "nohup: SIGTERM still stops it (143)" || bad "nohup: exit $rc after SIGTERM, expected 143"
has "$T/nohup.err" "interrupted by SIGTERM after step" "nohup: SIGTERM saved"

# --- SIGINT twice: the first is acknowledged, the second exits at once, without saving
start int2
wait_for "$T/int2.err" "^step 1/" || bad "2 x SIGINT: the run never reached step 1"
kill -INT $pid
wait_for "$T/int2.err" "SIGINT: stopping after the current step" || bad "2 x SIGINT: the first was not acknowledged"
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && ok "2 x SIGINT: exit 130" || bad "2 x SIGINT: exit $rc, expected 130"
has "$T/int2.err" "^ctrain: second interrupt: exiting now without saving$" "2 x SIGINT: one line says so"
status "$T/int2.out" interrupted "2 x SIGINT: summary on stdout, status interrupted"
status "$T/int2.json" interrupted "2 x SIGINT: --summary written, status interrupted"
has "$T/int2.json" '"error":"second interrupt: exited without saving after step [0-9]' "2 x SIGINT: the summary says why"
[ -f "$T/int2/checkpoints/latest" ] && bad "2 x SIGINT: a checkpoint was saved" || ok "2 x SIGINT: nothing saved"
if grep -q "interrupted by SIGINT after step" "$T/int2.err"; then bad "2 x SIGINT: the run saved and ended normally"; fi

# --- SIGINT twice right after an eval: the summary has that eval's loss (it was null: the copy the
# second SIGINT prints was made before the step's eval)
random_csv "$T/eval.csv" 64 64 4 6
env --default-signal=HUP "$B" --config "$C" --set train.run_dir=\""$T/int3"\" --set train.eval_interval=1 \
    --set 'data.eval={"format": "csv", "path": "eval.csv"}' >"$T/int3.out" 2>"$T/int3.err" &
pid=$!
wait_for "$T/int3.err" "^eval  step 1 " || bad "2 x SIGINT after an eval: no eval line"
kill -INT $pid
wait_for "$T/int3.err" "SIGINT: stopping after the current step" || bad "2 x SIGINT after an eval: not acknowledged"
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && ok "2 x SIGINT after an eval: exit 130" || bad "2 x SIGINT after an eval: exit $rc, expected 130"
has "$T/int3.out" '"eval_loss":[0-9]' "2 x SIGINT after an eval: the summary has the eval loss"

# --- a stop signal before the first step exits at once: here ctrain waits in the set-up to read its
# config from a FIFO nobody writes (as a slow set-up, inflating a data file, would): 143 at once with
# one line and the summary (the signal used to be noted for "after the step" and the run waited on)
mkfifo "$T/setup.fifo"
timeout -s KILL 20 "$B" --config "$T/setup.fifo" >"$T/setup.out" 2>"$T/setup.err" &
pid=$!
sleep 0.3
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ] && ok "SIGTERM in the set-up: exit 143 at once" || bad "SIGTERM in the set-up: exit $rc, expected 143 (137: it hung)"
has "$T/setup.err" "^ctrain: SIGTERM before the run's first step: exiting now (nothing trained yet, nothing to save)$" \
    "SIGTERM in the set-up: one line says so"
status "$T/setup.out" interrupted "SIGTERM in the set-up: summary on stdout, status interrupted"

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
