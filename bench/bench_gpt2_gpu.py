#!/usr/bin/env python3
"""GPU benchmark: ctrain against PyTorch 2.x on configs/gpt2_124m.json (GPT-2 124M: 12 pre-norm
blocks, width 768, 12 heads, sequences of 1024, vocabulary 50304, tied head) or, with --model
smollm, configs/smollm_135m.json (a Llama shaped like SmolLM-135M: 30 llama_blocks, width 576, 9
heads of which 3 kv heads, MLP 1536, sequences of 2048, vocabulary 49152, tied head), bf16,
tokens/s, MFU and peak GPU memory.

Run from the repository root (or a bundle's root) on a machine with a GPU and PyTorch 2.x:
    python3 bench/bench_gpt2_gpu.py [--model gpt2|smollm] [--build build] [--micro-batch 16]
                                    [--steps 20] [--warmup 5]

Data: random token ids in an llm.c shard (written once into --data, 4M tokens); the speed of a
step does not depend on the text. Both sides train the same model (GPT-2 init, AdamW lr 6e-4,
betas 0.9/0.95, weight decay 0.1 on 2-D weights, gradient clipping 1.0, bf16 autocast, no eval)
for --warmup + --steps steps and time the last --steps.

PyTorch runs in a fresh process per mode (so peak memory is per run), the way nanoGPT trains:
  eager     bf16 autocast, F.scaled_dot_product_attention (flash), fused AdamW
  compile   the same under torch.compile
ctrain runs once with a metrics.jsonl row per step, timed from the last warm-up step to the last
step (start-up, the first steps and the final save are not timed). One JSON line per measurement,
then one with the ratios (the transformer issue's targets: MFU >= 45%, tokens/s >= 1.0x compile).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

# per model: its config, sequence, width, blocks, heads, kv heads, MLP width, embedding rows, tokens
MODELS = {
    "gpt2": dict(config="configs/gpt2_124m.json", T=1024, C=768, L=12, H=12, KV=12, I=3072, V=50304, VOCAB=50257),
    "smollm": dict(config="configs/smollm_135m.json", T=2048, C=576, L=30, H=9, KV=3, I=1536, V=49152, VOCAB=49152),
}
H100_BF16_PEAK = 989e12  # dense bf16 tensor-core peak of an H100 SXM, the figure MFU is quoted against


def write_shard(path, n_tokens, vocab, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, n_tokens
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, vocab, n_tokens, dtype=np.uint16).tobytes())


def torch_child(name, mode, data, B, steps, warmup):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_gpt import adamw_gpt, build_gpt, build_llama

    m = MODELS[name]
    T, C, L, V, VOCAB = m["T"], m["C"], m["L"], m["V"], m["VOCAB"]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    raw = np.fromfile(data, dtype=np.uint16, offset=1024)

    if name == "gpt2":
        model = build_gpt(C, L, m["H"], V, T, flash=True).to(dev)
    else:
        model = build_llama(C, L, m["H"], m["KV"], m["I"], V, T, 10000.0, 1e-5, flash=True).to(dev)
    opt = adamw_gpt(model, 6e-4, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    rng = np.random.default_rng(0)
    n_win = (len(raw) - 1) // T

    def batch():
        w = rng.integers(0, n_win, B) * T
        x = torch.from_numpy(np.stack([raw[i:i + T + 1] for i in w]).astype(np.int64)).pin_memory()
        return x.to(dev, non_blocking=True)

    torch.cuda.reset_peak_memory_stats()
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(x[:, :-1])
        loss = F.cross_entropy(logits.float()[..., :VOCAB].reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    tps = steps * B * T / dt
    flops_per_token = 6 * n_params + 6 * L * C * T  # the same count as ctrain's summary
    print(json.dumps({"impl": "pytorch-" + mode, "model": name, "micro_batch": B, "steps": steps, "s_per_step": dt / steps,
                      "tokens_per_s": tps, "mfu": tps * flops_per_token / H100_BF16_PEAK,
                      "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
                      "peak_allocated_bytes": torch.cuda.max_memory_allocated(), "loss": float(loss)}))


def run_ctrain(name, build, data, B, steps, warmup, extra):
    """One run of warmup + steps steps with a metrics.jsonl row per step: tokens/s from the wall_s of
    the last warm-up step and of the last step, so start-up, the first steps and the final
    checkpoint save are not timed. (Each step ends with a host read of its loss, so wall_s is
    taken after the step's device work.)"""
    with tempfile.TemporaryDirectory() as tmp:
        summary, run = os.path.join(tmp, "s.json"), os.path.join(tmp, "run")
        m = MODELS[name]
        T = m["T"]
        cmd = [os.path.join(build, "ctrain"), "--quiet", "--device", "cuda", "--config", m["config"],
               "--set", "train.max_steps=%d" % (warmup + steps), "--set", "steps_per_print=1",
               "--set", "data.eval=null", "--set", 'data.train.path="%s"' % os.path.abspath(data),
               "--set", "data.train.vocab=%d" % m["VOCAB"],
               "--set", "train_batch_size=%d" % B, "--set", "train_micro_batch_size_per_gpu=%d" % B,
               "--set", "scheduler.params.warmup_num_steps=2",
               "--set", 'train.run_dir="%s"' % run, "--summary", summary] + extra
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(json.dumps({"impl": "ctrain", "error": r.returncode, "stderr": r.stderr[-2000:]}))
            return None
        with open(summary) as f:
            b = json.load(f)
        wall = {}
        with open(os.path.join(run, "metrics.jsonl")) as f:
            for line in f:
                row = json.loads(line)
                if row.get("type") == "train":
                    wall[row["step"]] = row["wall_s"]
        dt = wall[warmup + steps] - wall[warmup]
        tps = steps * B * T / dt
        out = {"impl": "ctrain", "model": name, "micro_batch": B, "steps": steps, "s_per_step": dt / steps, "tokens_per_s": tps,
               "mfu": b["mfu"] * tps / b["tokens_per_s"] if b.get("mfu") and b.get("tokens_per_s") else None,
               "summary_tokens_per_s": b.get("tokens_per_s"), "summary_mfu": b.get("mfu"),
               "peak_device_bytes": b.get("peak_device_bytes"), "loss": b.get("train_loss"),
               "activation_bytes": (b.get("peak_bytes_by_category") or {}).get("activations"),
               "planned_activation_bytes": (b.get("planned_bytes_by_category") or {}).get("activations")}
        print(json.dumps(out), flush=True)
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    ap.add_argument("--data", default="", help="an llm.c shard of random tokens (default /tmp/<model>_random.bin)")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--ctrain-set", action="append", default=[], help="extra --set for ctrain (repeatable)")
    ap.add_argument("--child", default="")
    a = ap.parse_args()
    a.data = a.data or "/tmp/%s_random.bin" % a.model
    if a.child:
        torch_child(a.model, a.child, a.data, a.micro_batch, a.steps, a.warmup)
        return
    if not os.path.exists(a.data):
        write_shard(a.data, 4 << 20, MODELS[a.model]["VOCAB"])
    extra = sum((["--set", s] for s in a.ctrain_set), [])
    ct = run_ctrain(a.model, a.build, a.data, a.micro_batch, a.steps, a.warmup, extra)
    res = {}
    for mode in a.modes.split(","):
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--model", a.model, "--data", a.data,
                            "--micro-batch", str(a.micro_batch), "--steps", str(a.steps), "--warmup", str(a.warmup)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(json.dumps({"impl": "pytorch-" + mode, "error": r.returncode, "stderr": r.stderr[-2000:]}))
            continue
        print(r.stdout.strip(), flush=True)
        res[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    if ct:
        print(json.dumps({"ratio_vs_" + m: ct["tokens_per_s"] / res[m]["tokens_per_s"] for m in res} |
                         {"ctrain_mfu": ct["mfu"], "targets": {"mfu": 0.45, "ratio_vs_compile": 1.0}}))


if __name__ == "__main__":
    main()
