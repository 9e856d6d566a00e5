#!/usr/bin/python3
"""CPU benchmark of the chunked LM head (model.loss.chunk_rows) on configs/tiny_lm.json: the
measured activation arena and the step time with the head's logits whole (chunk_rows 0) and in
chunks of each --chunks size, optionally with every transformer_block checkpointed and with a
larger vocabulary (--vocab: the embedding and the tied head widened; the byte tokens stay below
256, so the model is the same but for the head's cost).

Run from the repository root after `make data-text`:
    /usr/bin/python3 bench/bench_head.py [--build build] [--micro 32] [--steps 12] [--pairs 2]
                                         [--chunks 512,128,auto] [--vocab 256] [--checkpoint]
                                         [--data datasets/text/train.bin]

Runs alternate between the settings, --pairs rounds (the machine may be shared: the load average
is printed with each run). Step time: the mean of wall_clock_breakdown's step_ms over the steps
after the first two; CPU seconds: user + system of the run. One JSON line per run, then the
means per setting.
"""
import argparse
import json
import os

import ctrain_run


def config(args, chunk_rows):
    with open("configs/tiny_lm.json") as f:
        cfg = json.load(f)
    cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] = args.micro
    for layer in cfg["model"]["layers"]:
        if layer["type"] == "repeat":
            layer["layers"][0]["checkpoint"] = args.checkpoint
        if layer.get("name") == "wte":
            layer["vocab"] = args.vocab
        if layer.get("name") == "head":
            layer["out"] = args.vocab
    cfg["model"]["loss"] = {"type": "cross_entropy", "chunk_rows": chunk_rows}
    cfg["data"] = {"train": {"format": "tokens", "path": os.path.abspath(args.data), "seq_len": 128}}
    cfg["train"].update({"max_steps": args.steps, "eval_interval": 0, "device": "cpu"})
    cfg["wall_clock_breakdown"] = True
    cfg["steps_per_print"] = 1
    return cfg


def run(args, chunk_rows):
    r = ctrain_run.measure(args.build, config(args, chunk_rows))
    summary, step_ms, cpu, load = r["summary"], r["step_ms"], r["cpu_s"], r["load"]
    return {"chunk_rows": chunk_rows, "micro": args.micro, "vocab": args.vocab, "checkpoint": args.checkpoint,
            "arena_bytes": summary["peak_bytes_by_category"]["activations"],
            "planned_bytes": summary["planned_bytes_by_category"]["activations"],
            "step_ms": sum(step_ms) / len(step_ms), "cpu_s": round(cpu, 2), "train_loss": summary["train_loss"],
            "load": round(load, 2)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--data", default="datasets/text/train.bin")
    p.add_argument("--micro", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--chunks", default="512,128")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--checkpoint", action="store_true")
    args = p.parse_args()
    settings = [0] + [int(c) if c.isdigit() else c for c in args.chunks.split(",") if c]
    runs = {s: [] for s in settings}
    for _ in range(args.pairs):
        for s in settings:
            r = run(args, s)
            print(json.dumps(r), flush=True)
            runs[s].append(r)
    means = {s: {"step_ms": round(sum(r["step_ms"] for r in rs) / len(rs), 1),
                 "cpu_s": round(sum(r["cpu_s"] for r in rs) / len(rs), 2),
                 "arena_bytes": rs[0]["arena_bytes"], "planned_bytes": rs[0]["planned_bytes"]}
             for s, rs in runs.items()}
    print(json.dumps({"means_by_chunk_rows": means}))


if __name__ == "__main__":
    main()
