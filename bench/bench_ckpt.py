#!/usr/bin/python3
"""CPU benchmark of activation checkpointing (issue 14) on configs/tiny_lm.json: the measured
activation arena at micro-batch m without checkpointing against 4m with every transformer_block
checkpointed ("checkpoint": true on the block: one segment per block), and the step time of both
at the same micro-batch.

Run from the repository root after `make data-text`:
    /usr/bin/python3 bench/bench_ckpt.py [--build build] [--m 8] [--steps 12] [--pairs 3]
                                         [--data datasets/text/train.bin] [--blocks 4]

--blocks: the number of transformer blocks (the config's repeat; 4 as configured). With 4 blocks the
4x is out of reach whatever the planner does (docs/BENCHMARKS.md, "Checkpointing and depth");
from 7 blocks on it holds (6 blocks: 1.09x the memory, 2026-11-27).

Memory: one short run per setting; the arena is the summary's peak_bytes_by_category.activations
(what the CPU backend allocated for the graph, the same bytes the GPU would). Time: --pairs runs
of --steps steps each way at micro-batch 4m, alternating (the machine may be shared: the load
average is printed with each run), step time as the mean of wall_clock_breakdown's step_ms over
the steps after the first two, and the run's CPU seconds (user + system of the child). One JSON
line per run, then one summary line.
"""
import argparse
import json
import os

import ctrain_run

def config(data, checkpoint, micro, steps, blocks):
    with open("configs/tiny_lm.json") as f:
        cfg = json.load(f)
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] = micro
    for layer in cfg["model"]["layers"]:
        if layer["type"] == "repeat":
            layer["layers"][0]["checkpoint"] = checkpoint
            layer["times"] = blocks
    cfg["data"] = {"train": {"format": "tokens", "path": os.path.abspath(data), "seq_len": 128}}
    cfg["train"].update({"max_steps": steps, "eval_interval": 0, "device": "cpu"})
    cfg["wall_clock_breakdown"] = True
    cfg["steps_per_print"] = 1
    return cfg


def run(build, data, checkpoint, micro, steps, blocks):
    r = ctrain_run.measure(build, config(data, checkpoint, micro, steps, blocks))
    summary, step_ms, cpu, load = r["summary"], r["step_ms"], r["cpu_s"], r["load"]
    return {"checkpoint": checkpoint, "micro": micro, "steps": steps, "blocks": blocks,
            "arena_bytes": summary["peak_bytes_by_category"]["activations"],
            "planned_bytes": summary["planned_bytes_by_category"]["activations"],
            "step_ms": sum(step_ms) / len(step_ms) if step_ms else None, "cpu_s": round(cpu, 2),
            "load_avg": round(load, 2), "train_loss": summary["train_loss"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--m", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--data", default="datasets/text/train.bin")
    ap.add_argument("--blocks", type=int, default=4)
    a = ap.parse_args()
    mem = {}
    for checkpoint, micro in ((False, a.m), (True, 4 * a.m), (False, 4 * a.m), (True, a.m)):
        r = run(a.build, a.data, checkpoint, micro, 3, a.blocks)
        mem[(checkpoint, micro)] = r["arena_bytes"]
        print(json.dumps(r), flush=True)
    times = {False: [], True: []}
    for _ in range(a.pairs):
        for checkpoint in (False, True):
            r = run(a.build, a.data, checkpoint, 4 * a.m, a.steps, a.blocks)
            times[checkpoint].append(r["step_ms"])
            print(json.dumps(r), flush=True)
    plain, ckpt = min(times[False]), min(times[True])
    print(json.dumps({"m": a.m, "arena_plain_m": mem[(False, a.m)], "arena_ckpt_4m": mem[(True, 4 * a.m)],
                      "ckpt_4m_over_plain_m": round(mem[(True, 4 * a.m)] / mem[(False, a.m)], 3),
                      "step_ms_plain_4m": times[False], "step_ms_ckpt_4m": times[True],
                      "overhead_of_best": round(ckpt / plain - 1.0, 3)}))


if __name__ == "__main__":
    main()
