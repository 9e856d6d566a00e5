#!/usr/bin/python3
"""Data-pipeline throughput: ctrain's loader vs torchvision ImageFolder + DataLoader.

Usage: /usr/bin/python3 bench/bench_data.py [--root DIR] [--workers N] [--batch B] [--ctrain CMD]

Both read the same PNG folder (default datasets/fmnist_png/train, made by
datasets/fmnist_to_png.py), decode to 1-channel float, normalise (mean 0.2860, std 0.3530),
shuffle and collate batches of B with N worker processes/threads, for one epoch, no model.
The page cache is warmed first so neither side pays for the disk. Prints one JSON line per
pipeline and one with the ratio. --ctrain is the command that runs `bench-data`
(default: build/ctrain bench-data)."""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

MEAN, STD = 0.2860, 0.3530


def warm(root):
    n = 0
    for d, _, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                fh.read()
            n += 1
    return n


def run_ctrain(cmd, root, workers, batch):
    cfg = {"train_batch_size": batch,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "data": {"train": {"format": "image_folder", "root": os.path.abspath(root), "channels": 1},
                    "workers": workers, "shuffle": True, "drop_last": False,
                    "transform": {"normalize": {"mean": [MEAN], "std": [STD]}}}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    try:
        out = subprocess.run(shlex.split(cmd) + ["--config", path, "--workers", str(workers)],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    r = json.loads(out.strip().splitlines()[-1])
    return {"bench": "data", "impl": "ctrain", "workers": workers, "batch": batch,
            "samples": r["samples"], "seconds": r["seconds"], "samples_per_s": r["samples_per_s"]}


def gray_loader(path):
    from PIL import Image
    with open(path, "rb") as f:
        return Image.open(f).convert("L")


def run_torchvision(root, workers, batch):
    import torch
    from torchvision import datasets, transforms
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MEAN,), (STD,))])
    ds = datasets.ImageFolder(root, transform=tf, loader=gray_loader)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                     drop_last=False)
    t0 = time.perf_counter()
    n = 0
    for x, y in dl:
        n += x.shape[0]
    secs = time.perf_counter() - t0
    return {"bench": "data", "impl": "torchvision", "workers": workers, "batch": batch,
            "samples": n, "seconds": round(secs, 4), "samples_per_s": round(n / secs, 1),
            "torch": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="datasets/fmnist_png/train")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctrain", default="build/ctrain bench-data")
    a = ap.parse_args()
    if not os.path.isdir(a.root):
        sys.exit(f"{a.root}: missing; create it with: python3 datasets/fmnist_to_png.py")
    files = warm(a.root)
    c = run_ctrain(a.ctrain, a.root, a.workers, a.batch)
    print(json.dumps(c), flush=True)
    t = run_torchvision(a.root, a.workers, a.batch)
    print(json.dumps(t), flush=True)
    print(json.dumps({"bench": "data", "ratio_ctrain_over_torchvision":
                      round(c["samples_per_s"] / t["samples_per_s"], 2),
                      "files": files, "root": a.root}))


if __name__ == "__main__":
    main()
