#!/usr/bin/env python3
"""GPU benchmark: ctrain against PyTorch 2.x on the Fashion-MNIST MLP and CNN (configs/fmnist_*.json).

Run from the repository root on a machine with a GPU and PyTorch 2.x (CUDA build):
    python3 bench/bench_gpu.py [--build build] [--models mlp,cnn] [--precisions fp32,bf16,fp16]
                               [--epochs 2] [--workers 0,1,2,4,8]

Both sides train the same model (the layers of configs/fmnist_<model>.json, Adam lr 1e-3, batch
128, shuffled, drop_last, normalised with mean 0.2860 / std 0.3530). The first epoch warms up
(cuDNN autotuning, torch.compile, ctrain's allocator and GEMM plans); the last epoch is timed.

PyTorch runs in a fresh process per measurement (so peak memory is per run) in three modes:
  eager     plain eager mode (fp32, or autocast for bf16/fp16 with a GradScaler for fp16)
  compile   torch.compile(model) with the same precision
The DataLoader uses pin_memory=True, persistent workers and its best worker count, chosen first by
timing a short eager run for each count in --workers. ctrain runs
    build/ctrain --config configs/fmnist_<model>.json --device cuda [--set bf16.enabled=true]

Every measurement is one JSON line on stdout: epoch time, samples/s, peak GPU memory (PyTorch:
max_memory_reserved and max_memory_allocated; ctrain: the summary's peak_device_bytes, which is
what its caching allocator obtained from cudaMalloc, i.e. comparable to "reserved"). The last line
per (model, precision) holds the ratios and the issue's targets: samples/s >= 3x PyTorch eager and
peak GPU memory <= 0.5x PyTorch eager.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"
BATCH = 128
MEAN, STD = 0.2860, 0.3530
TARGET_SPEEDUP = 3.0
TARGET_MEMORY = 0.5


# ---- PyTorch side (runs in a child process) ----

def load_idx(name, offset):
    import numpy as np
    with gzip.open(os.path.join(DATA, name)) as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def build_model(config_path):
    """The torch equivalent of the config's layer list (the layer types the fmnist configs use)."""
    import torch.nn as nn
    with open(config_path) as f:
        cfg = json.load(f)
    shape = list(cfg["model"]["input"])  # [C, H, W]
    mods = []
    for layer in cfg["model"]["layers"]:
        t = layer["type"]
        if t == "flatten":
            mods.append(nn.Flatten())
            n = 1
            for d in shape:
                n *= d
            shape = [n]
        elif t == "linear":
            mods.append(nn.Linear(shape[0], layer["out"], bias=layer.get("bias", True)))
            shape = [layer["out"]]
        elif t == "relu":
            mods.append(nn.ReLU())
        elif t == "conv2d":
            k = layer.get("kernel", 3)
            s = layer.get("stride", 1)
            p = layer.get("padding", 0)
            mods.append(nn.Conv2d(shape[0], layer["out"], k, stride=s, padding=p,
                                  bias=layer.get("bias", True)))
            shape = [layer["out"], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        elif t == "maxpool2d":
            k = layer.get("kernel", 2)
            s = layer.get("stride", k)
            p = layer.get("padding", 0)
            mods.append(nn.MaxPool2d(k, stride=s, padding=p))
            shape = [shape[0], (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1]
        else:
            raise SystemExit(f"bench_gpu.py: layer type {t!r} has no torch equivalent here")
    return nn.Sequential(*mods)


def torch_child(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    class FashionMNIST(Dataset):
        """Decodes and normalises one sample per call, as a torchvision pipeline would."""

        def __init__(self):
            self.x = load_idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28)
            self.y = load_idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64)

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            img = (self.x[i].astype(np.float32) / 255.0 - MEAN) / STD
            return torch.from_numpy(img), int(self.y[i])

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    model = build_model(args.config).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    amp_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    use_scaler = args.precision == "fp16"
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=use_scaler)
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=use_scaler)
    step_fn_model = torch.compile(model) if args.mode == "compile" else model
    loader = DataLoader(FashionMNIST(), batch_size=BATCH, shuffle=True, drop_last=True,
                        num_workers=args.workers, pin_memory=True,
                        persistent_workers=args.workers > 0)
    torch.cuda.reset_peak_memory_stats()

    def run_epoch(max_steps):
        steps = 0
        loss = None
        for xb, yb in loader:
            xb = xb.to(dev, non_blocking=True)
            yb = yb.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = F.cross_entropy(step_fn_model(xb), yb)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            steps += 1
            if max_steps and steps >= max_steps:
                break
        torch.cuda.synchronize()
        return steps, loss

    for _ in range(max(args.epochs - 1, 0)):
        run_epoch(args.max_steps)
    t0 = time.perf_counter()
    steps, loss = run_epoch(args.max_steps)
    secs = time.perf_counter() - t0
    steps_per_epoch = len(loader)
    print(json.dumps({
        "epoch_s": secs * steps_per_epoch / steps,
        "samples_per_s": steps * BATCH / secs,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "loss": float(loss.item()),
        "timed_steps": steps,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
    }))


# ---- driver ----

def emit(**kw):
    print(json.dumps(kw), flush=True)


def run_torch(model, mode, precision, workers, epochs, max_steps):
    cmd = [sys.executable, __file__, "--torch-child", "--config", f"configs/fmnist_{model}.json",
           "--mode", mode, "--precision", precision, "--workers", str(workers),
           "--epochs", str(epochs), "--max-steps", str(max_steps)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_ctrain(build, model, precision, epochs, extra):
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "summary.json")
        cmd = [os.path.join(build, "ctrain"), "--config", f"configs/fmnist_{model}.json",
               "--device", "cuda", "--quiet", "--summary", summary,
               "--set", f"train.epochs={epochs}", "--set", f"train.run_dir={d}/run"]
        if precision == "bf16":
            cmd += ["--set", "bf16.enabled=true"]
        elif precision == "fp16":
            cmd += ["--set", "fp16.enabled=true"]
        for kv in extra:
            cmd += ["--set", kv]
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()
            return {"error": tail[-1] if tail else f"exit {out.returncode}"}
        with open(summary) as f:
            s = json.load(f)
    samples_per_epoch = (60000 // BATCH) * BATCH
    return {"epoch_s": samples_per_epoch / s["samples_per_s"], "samples_per_s": s["samples_per_s"],
            "peak_device_bytes": s["peak_device_bytes"], "loss": s.get("train_loss"),
            "eval_accuracy": s.get("eval_accuracy"), "wall_s": wall,
            "peak_bytes_by_category": s.get("peak_bytes_by_category")}


def rounded(d):
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--epochs", type=int, default=2, help="epochs per run; the last one is timed")
    ap.add_argument("--workers", default="0,1,2,4,8", help="DataLoader worker counts to try")
    ap.add_argument("--probe-steps", type=int, default=150, help="steps per worker-count probe")
    ap.add_argument("--modes", default="eager,compile",
                    help="PyTorch modes to run (eager is the baseline of the targets; compile takes minutes)")
    ap.add_argument("--ctrain-set", action="append",
                    default=["data.transform.on_device=true", "train.cuda_graph=auto"],
                    help="extra KEY=VALUE overrides for the ctrain runs (repeatable)")
    # child mode
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="eager", help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--max-steps", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        a.workers = int(a.workers)
        torch_child(a)
        return

    common = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cores": os.cpu_count()}
    cores = os.cpu_count() or 1
    worker_counts = [w for w in (int(x) for x in a.workers.split(",")) if w <= cores]
    for model in a.models.split(","):
        # best DataLoader worker count, timed on short eager AMP runs
        best_w, best_rate = 0, -1.0
        for w in worker_counts:
            r = run_torch(model, "eager", "bf16", w, 1, a.probe_steps)
            emit(framework="pytorch", model=model, probe="workers", workers=w, **rounded(r), **common)
            if "error" not in r and r["samples_per_s"] > best_rate:
                best_w, best_rate = w, r["samples_per_s"]
        for precision in a.precisions.split(","):
            res = {}
            for mode in a.modes.split(","):
                r = run_torch(model, mode, precision, best_w, a.epochs, 0)
                res[mode] = r
                emit(framework="pytorch", model=model, mode=mode, precision=precision,
                     workers=best_w, **rounded(r), **common)
            c = run_ctrain(a.build, model, precision, a.epochs, a.ctrain_set)
            emit(framework="ctrain", model=model, precision=precision, **rounded(c), **common)
            eager = res.get("eager", {"error": "not run"})
            if "error" in c or "error" in eager:
                emit(model=model, precision=precision, summary=True, error="a run failed", **common)
                continue
            speedup = c["samples_per_s"] / eager["samples_per_s"]
            mem = c["peak_device_bytes"] / eager["peak_reserved_bytes"]
            line = dict(model=model, precision=precision, summary=True,
                        ctrain_samples_per_s=round(c["samples_per_s"], 1),
                        pytorch_eager_samples_per_s=round(eager["samples_per_s"], 1),
                        speedup_vs_eager=round(speedup, 3), speedup_target=TARGET_SPEEDUP,
                        speedup_ok=speedup >= TARGET_SPEEDUP,
                        ctrain_peak_device_bytes=c["peak_device_bytes"],
                        pytorch_eager_peak_reserved_bytes=eager["peak_reserved_bytes"],
                        pytorch_eager_peak_allocated_bytes=eager["peak_allocated_bytes"],
                        memory_ratio_vs_eager=round(mem, 3), memory_target=TARGET_MEMORY,
                        memory_ok=mem <= TARGET_MEMORY, pytorch_workers=best_w,
                        device=eager.get("device"), torch=eager.get("torch"))
            comp = res.get("compile", {"error": "not run"})
            if "error" not in comp:
                line["speedup_vs_compile"] = round(c["samples_per_s"] / comp["samples_per_s"], 3)
                line["memory_ratio_vs_compile"] = round(
                    c["peak_device_bytes"] / comp["peak_reserved_bytes"], 3)
            emit(**line, **common)


if __name__ == "__main__":
    main()
