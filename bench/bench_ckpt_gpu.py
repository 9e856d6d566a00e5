#!/usr/bin/env python3
"""GPU benchmark of activation checkpointing (issue 14) on configs/gpt2_124m.json (bf16, sequences of
1024): the issue's two figures on the GPU, and what cpu_checkpointing costs.

Run from the repository root (or a bundle's root) on a machine with a GPU:
    python3 bench/bench_ckpt_gpu.py [--build .] [--m 4] [--steps 10] [--warmup 3]

Runs, each a fresh process (bench_gpt2_gpu.run_ctrain: random tokens in an llm.c shard, no eval,
time from the last warm-up step to the last step):
  plain m          nothing checkpointed, micro-batch m
  ckpt 4m          every transformer_block marked "checkpoint": true (12 segments), micro-batch 4m
  plain 4m         nothing checkpointed at 4m (may not fit: then the memory figure is the plan's)
  ckpt 4m offload  the same with activation_checkpointing.cpu_checkpointing (kept block outputs in
                   pinned host memory, copied back one segment ahead on the copy stream)
Memory: the activation arena the CUDA backend allocated (the summary's peak_bytes_by_category), the
issue's figure ("fits 4x the micro-batch in the same activation memory": ckpt 4m against plain m);
peak device bytes beside it. Time: ckpt 4m against plain 4m (target <= 1.30x on the GPU), and the
offload run against ckpt 4m. One JSON line per run, then one with the ratios.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt2_gpu as g  # noqa: E402

MARK = "model.layers.2.layers.0.checkpoint=true"   # the repeat's transformer_block


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=".")
    ap.add_argument("--data", default="/tmp/gpt2_random.bin")
    ap.add_argument("--m", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(a.data):
        g.write_shard(a.data, 4 << 20)
    runs = {
        "plain_m": (a.m, []),
        "ckpt_4m": (4 * a.m, ["--set", MARK]),
        "plain_4m": (4 * a.m, []),
        "ckpt_4m_offload": (4 * a.m, ["--set", MARK, "--set", "activation_checkpointing.cpu_checkpointing=true"]),
    }
    res = {}
    for name, (micro, extra) in runs.items():
        r = g.run_ctrain(a.build, a.data, micro, a.steps, a.warmup, extra)
        if r:
            r["run"] = name
            print(json.dumps(r), flush=True)
        res[name] = r

    def ratio(x, y, key):
        return res[x][key] / res[y][key] if res.get(x) and res.get(y) and res[x].get(key) and res[y].get(key) else None

    print(json.dumps({
        "activations_ckpt_4m_over_plain_m": ratio("ckpt_4m", "plain_m", "activation_bytes"),
        "peak_ckpt_4m_over_plain_m": ratio("ckpt_4m", "plain_m", "peak_device_bytes"),
        "step_ckpt_4m_over_plain_4m": ratio("ckpt_4m", "plain_4m", "s_per_step"),
        "step_offload_over_ckpt_4m": ratio("ckpt_4m_offload", "ckpt_4m", "s_per_step"),
        "targets": {"activations_ckpt_4m_over_plain_m": 1.0, "step_ckpt_4m_over_plain_4m": 1.30}}))


if __name__ == "__main__":
    main()
