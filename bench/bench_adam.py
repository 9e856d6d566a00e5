"""bench_adam.py: ctrain's CPU AdamW step against torch.optim.AdamW, in the same run.

Usage: /usr/bin/python3 bench/bench_adam.py [--n 100000000] [--threads 2] [--rounds 3] [--steps 5]
           [--copy none|f16|bf16] [--build build]

Builds bench/bench_adam.c against BUILD/libctrain.a (`make CUDA=0 BUILD/libctrain.a` first), then
alternates rounds: ctrain's step (the kernel the backend picks, and the baseline kernel), torch's
AdamW with foreach=True, foreach=False, and fused=True (when this torch runs fused on the CPU).
All update one flat fp32 buffer of n parameters with the same hyper-parameters, on the same
thread count. Other processes share the machine, so the rounds interleave the contenders and the report gives each
one's median and its spread (min..max over every timed step); the ratio compares medians against
torch's fastest setting. Prints one JSON line per round and contender, then the summary.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def build_ctrain(build):
    exe = os.path.join(build, "bench_adam")
    lib = os.path.join(build, "libctrain.a")
    if not os.path.exists(lib):
        sys.exit(f"bench_adam.py: {lib} is missing: run `make CUDA=0 {lib}` first")
    subprocess.run(["cc", "-O2", "-std=c11", "-D_GNU_SOURCE", "-I" + ROOT,
                    os.path.join(HERE, "bench_adam.c"), lib, "-lcjson", "-lpng", "-ljpeg", "-lz",
                    "-lm", "-ldl", "-pthread", "-o", exe], check=True)
    return exe


def run_ctrain(exe, n, threads, steps, isa, copy):
    out = subprocess.run([exe, str(n), str(threads), str(steps), str(isa), copy], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def torch_setting_works(setting):
    p = torch.zeros(16, requires_grad=True)
    p.grad = torch.ones(16)
    try:
        torch.optim.AdamW([p], **setting).step()
        return True
    except (RuntimeError, TypeError, ValueError):
        return False


def run_torch(n, steps, setting, copy):
    g = torch.Generator().manual_seed(1)
    p = (torch.rand(n, generator=g) * 2 - 1).requires_grad_(True)
    p.grad = torch.rand(n, generator=g) * 2e-2 - 1e-2
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            **setting)
    half = {"f16": torch.float16, "bf16": torch.bfloat16}.get(copy)
    copy_buf = torch.empty(n, dtype=half) if half else None
    seconds = []
    with torch.no_grad():
        for s in range(steps + 1):
            t0 = time.perf_counter()
            opt.step()
            if copy_buf is not None:  # mixed precision: the 16-bit copy of the new weights
                copy_buf.copy_(p)
            t = time.perf_counter() - t0
            if s > 0:
                seconds.append(t)
    del opt, p
    return seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--copy", default="none", choices=["none", "f16", "bf16"])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    exe = build_ctrain(args.build)

    # foreach (multi-tensor), the single-tensor loop (with one flat tensor it can be the faster),
    # and fused where this torch runs it on the CPU (1.13 does not accept it for AdamW)
    candidates = (("foreach", {"foreach": True}), ("single_tensor", {"foreach": False}),
                  ("fused", {"fused": True}))
    settings = {name: s for name, s in candidates if torch_setting_works(s)}
    times = {}
    for r in range(args.rounds):
        for isa, name in ((-1, "ctrain"), (0, "ctrain_baseline_kernel")):
            res = run_ctrain(exe, args.n, args.threads, args.steps, isa, args.copy)
            times.setdefault(name, []).extend(res["seconds"])
            print(json.dumps({"round": r, "contender": name, **res}), flush=True)
        for name, s in settings.items():
            sec = run_torch(args.n, args.steps, s, args.copy)
            times.setdefault("torch_" + name, []).extend(sec)
            print(json.dumps({"round": r, "contender": "torch_" + name, "seconds": sec}),
                  flush=True)

    summary = {}
    for name, sec in times.items():
        med = statistics.median(sec)
        summary[name] = {"median_s": round(med, 4), "min_s": round(min(sec), 4),
                         "max_s": round(max(sec), 4), "gparam_s": round(args.n / med / 1e9, 3)}
    torch_best = min((k for k in summary if k.startswith("torch_")),
                     key=lambda k: summary[k]["median_s"])
    ratio = summary[torch_best]["median_s"] / summary["ctrain"]["median_s"]
    print(json.dumps({"n": args.n, "threads": args.threads, "copy": args.copy,
                      "torch": torch.__version__, "torch_fastest": torch_best,
                      "speedup_vs_torch": round(ratio, 2), "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
