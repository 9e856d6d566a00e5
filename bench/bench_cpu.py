#!/usr/bin/python3
"""CPU benchmark: ctrain against PyTorch on the Fashion-MNIST MLP and CNN (configs/fmnist_*.json).

Run from the repository root with Debian's python3-torch:
    /usr/bin/python3 bench/bench_cpu.py [--build build] [--steps 200] [--models mlp,cnn]

Both sides train the same model (same layers, Adam lr 1e-3, batch 128, shuffled, normalised with
mean 0.2860 / std 0.3530) for --steps optimizer steps; the epoch time is the time per step times
the 468 steps of an epoch. PyTorch keeps the images as uint8 and normalises each batch (the
cheapest way to feed it), runs in its own process per thread setting (torch threads x
OPENBLAS_NUM_THREADS in {1, 2}), and the fastest setting is the baseline. ctrain runs with 1 and 2
threads. Every measurement is one JSON line on stdout; the last line per model holds the ratios
and the targets of the core-engine issue (epoch time MLP <= 1.0x, CNN <= 0.8x, peak RSS <= 0.3x,
launch to first step <= 0.5 s).
"""
import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"
STEPS_PER_EPOCH = 60000 // 128
TARGET_EPOCH = {"mlp": 1.0, "cnn": 0.8}


def torch_child(model_name, threads, steps):
    """Runs in a fresh process: train `steps` steps, print one JSON line."""
    t_launch = time.time()
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)

    def idx(name, offset):
        with gzip.open(os.path.join(DATA, name)) as f:
            return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)

    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
    y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    # The eval set is loaded as ctrain loads it, so resident memory compares like with like.
    x_test = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28).copy())
    nn = torch.nn
    if model_name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                              nn.ReLU(), nn.Linear(512, 10))
    else:
        model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    perm = torch.randperm(x.shape[0])
    warmup, first_step = 5, None
    for s in range(steps + warmup):
        if s == warmup:
            t0 = time.time()
        if first_step is None:
            first_step = time.time() - t_launch
        b = perm[s * 128:(s + 1) * 128]
        xb = (x[b].float() / 255.0 - 0.2860) / 0.3530
        loss = nn.functional.cross_entropy(model(xb), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    step_s = (time.time() - t0) / steps
    del x_test
    assert torch.isfinite(loss).item()
    print(json.dumps({"step_s": step_s, "first_step_s": first_step,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def run_torch(model, threads, blas, steps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads))
    t = time.time()
    out = subprocess.run([sys.executable, __file__, "--torch-child", model, str(threads), str(steps)],
                         env=env, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["wall_s"] = time.time() - t  # the whole child process, for reference
    return r


def run_ctrain(build, model, threads, steps):
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "s.json")
        cmd = [os.path.join(build, "ctrain"), "--config", f"configs/fmnist_{model}.json", "--quiet",
               "--summary", summary, "--set", f"train.max_steps={steps}", "--set", f"train.threads={threads}",
               "--set", "data.eval.limit=128"]
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        with open(summary) as f:
            s = json.load(f)
    assert s["status"] == "ok", s
    return {"step_s": 128 / s["samples_per_s"], "first_step_s": s["first_step_s"],
            "peak_rss_bytes": s["peak_host_bytes"]}


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--torch-child", nargs=3, metavar=("MODEL", "THREADS", "STEPS"))
    a = ap.parse_args()
    if a.torch_child:
        torch_child(a.torch_child[0], int(a.torch_child[1]), int(a.torch_child[2]))
        return
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    common = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu, "cores": os.cpu_count(), "steps": a.steps}
    for model in a.models.split(","):
        best_t = best_c = None
        for threads in (1, 2):
            for blas in (1, 2):
                r = run_torch(model, threads, blas, a.steps)
                r["epoch_s"] = r["step_s"] * STEPS_PER_EPOCH
                emit(framework="pytorch", model=model, torch_threads=threads, openblas_threads=blas,
                     **{k: round(v, 4) for k, v in r.items()}, **common)
                if best_t is None or r["epoch_s"] < best_t["epoch_s"]:
                    best_t = dict(r, torch_threads=threads, openblas_threads=blas)
        for threads in (1, 2):
            r = run_ctrain(a.build, model, threads, a.steps)
            r["epoch_s"] = r["step_s"] * STEPS_PER_EPOCH
            emit(framework="ctrain", model=model, threads=threads,
                 **{k: round(v, 4) for k, v in r.items()}, **common)
            if best_c is None or r["epoch_s"] < best_c["epoch_s"]:
                best_c = dict(r, threads=threads)
        epoch_ratio = best_c["epoch_s"] / best_t["epoch_s"]
        rss_ratio = best_c["peak_rss_bytes"] / best_t["peak_rss_bytes"]
        emit(model=model, summary=True, ctrain_epoch_s=round(best_c["epoch_s"], 3),
             pytorch_epoch_s=round(best_t["epoch_s"], 3), epoch_time_ratio=round(epoch_ratio, 3),
             epoch_time_target=TARGET_EPOCH[model], epoch_time_ok=epoch_ratio <= TARGET_EPOCH[model],
             ctrain_peak_rss_bytes=best_c["peak_rss_bytes"], pytorch_peak_rss_bytes=best_t["peak_rss_bytes"],
             peak_rss_ratio=round(rss_ratio, 3), peak_rss_ok=rss_ratio <= 0.3,
             ctrain_first_step_s=best_c["first_step_s"], first_step_ok=best_c["first_step_s"] <= 0.5,
             pytorch_first_step_s=round(best_t["first_step_s"], 3),
             pytorch_best={"torch_threads": best_t["torch_threads"], "openblas_threads": best_t["openblas_threads"]},
             ctrain_best_threads=best_c["threads"], **common)


if __name__ == "__main__":
    main()
