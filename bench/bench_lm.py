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
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

B, T, C, L, H, V = 32, 128, 128, 4, 4, 256
DATA = "datasets/text/train.bin"


CONFIGS = {"gpt": "configs/tiny_lm.json", "llama": "configs/llama_tiny.json"}


def torch_child(model_name, threads, steps, warmup):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_gpt import adamw_gpt, build_gpt, build_llama

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    raw = np.fromfile(DATA, dtype=np.uint16, offset=32)  # ctrain token file: 32-byte header, uint16

    if model_name == "llama":
        model = build_llama(C, L, H, 2, 400, V, T, 10000.0, 1e-5, flash=False)
    else:
        model = build_gpt(C, L, H, V, T, flash=False)
    opt = adamw_gpt(model, 2e-3)
    rng = np.random.default_rng(0)
    n_win = (len(raw) - 1) // T
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            t0 = time.perf_counter()
        w = rng.integers(0, n_win, B) * T
        batch = torch.from_numpy(np.stack([raw[i:i + T + 1] for i in w]).astype(np.int64))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "model": model_name, "threads": threads,
                      "steps": steps, "s_per_step": dt / steps,
                      "tokens_per_s": steps * B * T / dt, "loss": float(loss)}))


def run_ctrain(model_name, build, threads, steps, warmup):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "s.json")

        def one(n):
            cmd = [os.path.join(build, "ctrain"), "--quiet", "--config", CONFIGS[model_name],
                   "--set", "train.max_steps=%d" % n, "--set", "train.threads=%d" % threads,
                   "--set", "data.eval=null", "--set", 'train.run_dir="%s/run%d"' % (tmp, n),
                   "--set", "train.device=\"cpu\"", "--summary", summary]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(summary) as f:
                return json.load(f)

        # the difference of two runs cancels set-up, the first steps and the final save
        a, b = one(warmup), one(warmup + steps)
        dt = b["wall_s"] - a["wall_s"]
        print(json.dumps({"impl": "ctrain", "model": model_name, "threads": threads, "steps": steps,
                          "s_per_step": dt / steps,
                          "tokens_per_s": steps * B * T / dt, "loss": b["train_loss"]}))
        return steps * B * T / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--child", type=int, default=0)
    ap.add_argument("--model", choices=sorted(CONFIGS), default="gpt")
    a = ap.parse_args()
    if a.child:
        torch_child(a.model, a.child, a.steps, a.warmup)
        return
    if not os.path.exists(DATA):
        sys.exit("bench_lm: %s is missing: run `make data-text` first" % DATA)
    best_torch = 0.0
    for threads in (1, 2):
        out = subprocess.run([sys.executable, __file__, "--child", str(threads), "--steps", str(a.steps),
                              "--warmup", str(a.warmup), "--model", a.model], check=True, capture_output=True,
                             text=True).stdout
        print(out.strip())
        best_torch = max(best_torch, json.loads(out)["tokens_per_s"])
    best_ct = max(run_ctrain(a.model, a.build, t, a.steps, a.warmup) for t in (1, 2))
    print(json.dumps({"ratio_tokens_per_s": best_ct / best_torch, "ctrain": best_ct, "pytorch": best_torch,
                      "target": 1.0}))


if __name__ == "__main__":
    main()
