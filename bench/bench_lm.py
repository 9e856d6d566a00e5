#!/usr/bin/python3
"""CPU benchmark: ctrain against PyTorch on configs/tiny_lm.json (a byte-level GPT: 4 pre-norm
blocks, width 128, 4 heads, sequences of 128, tied head) or, with --model llama,
configs/llama_tiny.json (the Llama of the same size: 4 llama_blocks, width 128, 4 heads of which 2
kv heads, MLP 400, tied head), tokens per second of training.

Run from the repository root after `make data-text`, with Debian's python3-torch:
    /usr/bin/python3 bench/bench_lm.py [--model gpt|llama] [--build build] [--steps 40] [--warmup 5]

Both sides train the same model (same layers and initial scales, AdamW lr 2e-3, betas 0.9/0.95,
weight decay 0.1, gradient clipping 1.0, micro-batch 32 x 128 tokens from datasets/text/train.bin,
no eval) for --warmup + --steps steps and time the last --steps. PyTorch runs in its own process
per thread setting (torch threads 1 and 2) and its fastest is the baseline; ctrain runs with 1
and 2 threads (train.threads). One JSON line per measurement, then one with the ratio
ctrain / PyTorch of the best tokens/s (the transformer issue's target: >= 1.0).

On a shared, loaded machine: --torch-python runs the PyTorch side on another interpreter (the
PyTorch 2.6 of `make deps-bench`: .venv-bench/bin/python), --attn sdpa gives it
F.scaled_dot_product_attention (PyTorch 2's fused CPU attention) instead of the explicit masked
softmax, and --rounds R interleaves R rounds of (PyTorch, ctrain) per thread setting so that a
change of load hits both. Every line then carries the CPU seconds of the timed steps (all threads:
PyTorch's process time over its timed loop; ctrain's children's rusage, differenced as its wall
time is) and the load average before and after, and the last line gives both ratios, of wall
tokens/s and of tokens per CPU second (the median over rounds of each side's best).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

B, T, C, L, H, V = 32, 128, 128, 4, 4, 256
DATA = "datasets/text/train.bin"


CONFIGS = {"gpt": "configs/tiny_lm.json", "llama": "configs/llama_tiny.json"}


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def load():
    return round(os.getloadavg()[0], 2)


def torch_child(model_name, threads, steps, warmup, attn):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_gpt import adamw_gpt, build_gpt, build_llama

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    raw = np.fromfile(DATA, dtype=np.uint16, offset=32)  # ctrain token file: 32-byte header, uint16

    if model_name == "llama":
        model = build_llama(C, L, H, 2, 400, V, T, 10000.0, 1e-5, flash=attn == "sdpa")
    else:
        model = build_gpt(C, L, H, V, T, flash=attn == "sdpa")
    opt = adamw_gpt(model, 2e-3)
    rng = np.random.default_rng(0)
    n_win = (len(raw) - 1) // T
    t0 = c0 = None
    for step in range(warmup + steps):
        if step == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        w = rng.integers(0, n_win, B) * T
        batch = torch.from_numpy(np.stack([raw[i:i + T + 1] for i in w]).astype(np.int64))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "attn": attn, "model": model_name,
                      "threads": threads, "steps": steps, "s_per_step": dt / steps,
                      "tokens_per_s": steps * B * T / dt, "cpu_s": cpu, "tokens_per_cpu_s": steps * B * T / cpu,
                      "loss": float(loss)}))


def run_ctrain(model_name, build, threads, steps, warmup):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "s.json")

        def one(n):
            c0 = children_cpu()
            cmd = [os.path.join(build, "ctrain"), "--quiet", "--config", CONFIGS[model_name],
                   "--set", "train.max_steps=%d" % n, "--set", "train.threads=%d" % threads,
                   "--set", "data.eval=null", "--set", 'train.run_dir="%s/run%d"' % (tmp, n),
                   "--set", "train.device=\"cpu\"", "--summary", summary]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(summary) as f:
                s = json.load(f)
            s["cpu_s"] = children_cpu() - c0
            return s

        # the difference of two runs cancels set-up, the first steps and the final save
        l0 = load()
        a, b = one(warmup), one(warmup + steps)
        dt, cpu = b["wall_s"] - a["wall_s"], b["cpu_s"] - a["cpu_s"]
        line = {"impl": "ctrain", "model": model_name, "threads": threads, "steps": steps, "s_per_step": dt / steps,
                "tokens_per_s": steps * B * T / dt, "cpu_s": cpu, "tokens_per_cpu_s": steps * B * T / cpu,
                "loss": b["train_loss"], "load": [l0, load()]}
        print(json.dumps(line), flush=True)
        return line


def run_torch(a, threads):
    l0 = load()
    out = subprocess.run([a.torch_python, __file__, "--child", str(threads), "--steps", str(a.steps),
                          "--warmup", str(a.warmup), "--model", a.model, "--attn", a.attn], check=True,
                         capture_output=True, text=True).stdout
    line = json.loads(out)
    line["load"] = [l0, load()]
    print(json.dumps(line), flush=True)
    return line


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--child", type=int, default=0)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--attn", choices=("masked", "sdpa"), default="masked")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    if a.child:
        torch_child(a.model, a.child, a.steps, a.warmup, a.attn)
        return
    if not os.path.exists(DATA):
        sys.exit("bench_lm: %s is missing: run `make data-text` first" % DATA)
    best = {"pytorch": [], "ctrain": []}   # per round: each side's best (tokens/s, tokens per CPU s)
    for _ in range(a.rounds):
        lines = {"pytorch": [], "ctrain": []}
        for threads in (1, 2):
            lines["pytorch"].append(run_torch(a, threads))
            lines["ctrain"].append(run_ctrain(a.model, a.build, threads, a.steps, a.warmup))
        for side, ls in lines.items():
            best[side].append((max(x["tokens_per_s"] for x in ls), max(x["tokens_per_cpu_s"] for x in ls)))
    med = {side: [statistics.median(r[i] for r in rs) for i in (0, 1)] for side, rs in best.items()}
    print(json.dumps({"ratio_tokens_per_s": med["ctrain"][0] / med["pytorch"][0],
                      "ratio_tokens_per_cpu_s": med["ctrain"][1] / med["pytorch"][1],
                      "ctrain": med["ctrain"], "pytorch": med["pytorch"], "rounds": a.rounds, "target": 1.0}))


if __name__ == "__main__":
    main()
