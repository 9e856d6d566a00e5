#!/usr/bin/python3
"""CPU benchmark: ctrain against PyTorch on the Fashion-MNIST MLP and CNN (configs/fmnist_*.json).

Run from the repository root with Debian's python3-torch:
    /usr/bin/python3 bench/bench_cpu.py [--build build] [--steps 200] [--models mlp,cnn] [--batch 128]
        [--torch-settings 1x1,1x2,2x1,2x2] [--bf16]

Both sides train the same model (same layers, Adam lr 1e-3, batch 128, shuffled, normalised with
mean 0.2860 / std 0.3530) for --steps optimizer steps of --batch samples; the epoch time is the
time per step times the steps of an epoch (60000 // batch). PyTorch keeps the images as uint8 and normalises each batch (the
cheapest way to feed it), runs in its own process per thread setting (torch threads x
OPENBLAS_NUM_THREADS in {1, 2}), and the fastest setting is the baseline. ctrain runs with 1 and 2
threads. Every measurement is one JSON line on stdout; the last line per model holds the ratios
and the targets: issue 18's (fp32 epoch time MLP <= 0.75x, CNN <= 0.55x PyTorch's best setting at
batch 128; no slower than PyTorch at other batch sizes), and the core-engine issue's (peak RSS <=
0.3x, launch to first step <= 0.5 s).

CPU time per step is reported beside the wall time: on a machine shared with other jobs the wall
time mostly measures their load, the CPU time much less. PyTorch's child measures its process CPU
time over the timed steps; ctrain's is the difference of the process CPU time (user + system) of a
run of --steps and of one of --steps // 5 steps, per step in between. --bf16: ctrain with
bf16.enabled, PyTorch under torch.autocast("cpu", torch.bfloat16).
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
TARGET_EPOCH_AT_128 = {"mlp": 0.75, "cnn": 0.55}


def torch_child(model_name, threads, steps, batch, bf16):
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
            t0, c0 = time.time(), time.process_time()
        if first_step is None:
            first_step = time.time() - t_launch
        i = (s * batch) % (x.shape[0] - batch + 1)
        b = perm[i:i + batch]
        xb = (x[b].float() / 255.0 - 0.2860) / 0.3530
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(xb), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    step_s = (time.time() - t0) / steps
    cpu_step_s = (time.process_time() - c0) / steps
    del x_test
    assert torch.isfinite(loss).item()
    print(json.dumps({"step_s": step_s, "cpu_step_s": cpu_step_s, "first_step_s": first_step,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def run_torch(model, threads, blas, steps, batch, bf16):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(blas), OMP_NUM_THREADS=str(threads))
    t = time.time()
    out = subprocess.run([sys.executable, __file__, "--torch-child", model, str(threads), str(steps),
                          str(batch), str(int(bf16))],
                         env=env, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["wall_s"] = time.time() - t  # the whole child process, for reference
    return r


def ctrain_once(build, model, threads, steps, batch, bf16):
    """One run: its summary and the CPU seconds (user + system) it took."""
    with tempfile.TemporaryDirectory() as d:
        summary = os.path.join(d, "s.json")
        cmd = [os.path.join(build, "ctrain"), "--config", f"configs/fmnist_{model}.json", "--quiet",
               "--summary", summary, "--set", f"train.max_steps={steps}", "--set", f"train.threads={threads}",
               "--set", f"train_batch_size={batch}", "--set", f"train_micro_batch_size_per_gpu={batch}",
               "--set", "data.eval.limit=128", "--set", f"train.run_dir={d}/run"]
        if bf16:
            cmd += ["--set", "bf16.enabled=true"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(summary) as f:
            s = json.load(f)
    assert s["status"] == "ok", s
    return s, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_ctrain(build, model, threads, steps, batch, bf16):
    s, cpu = ctrain_once(build, model, threads, steps, batch, bf16)
    short = max(1, steps // 5)
    _, cpu_short = ctrain_once(build, model, threads, short, batch, bf16)
    return {"step_s": batch / s["samples_per_s"], "cpu_step_s": (cpu - cpu_short) / (steps - short),
            "first_step_s": s["first_step_s"], "peak_rss_bytes": s["peak_host_bytes"]}


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--baseline-build", help="also run this build's ctrain (before/after a change)")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--torch-settings", default="1x1,1x2,2x1,2x2",
                    help="torch threads x OPENBLAS_NUM_THREADS, comma-separated")
    ap.add_argument("--torch-child", nargs=5, metavar=("MODEL", "THREADS", "STEPS", "BATCH", "BF16"))
    a = ap.parse_args()
    if a.torch_child:
        m, th, st, ba, bf = a.torch_child
        torch_child(m, int(th), int(st), int(ba), bool(int(bf)))
        return
    steps_per_epoch = 60000 // a.batch
    settings = [tuple(int(v) for v in t.split("x")) for t in a.torch_settings.split(",")]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    common = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu, "cores": os.cpu_count(), "steps": a.steps,
              "batch": a.batch, "precision": "bf16" if a.bf16 else "fp32", "load": round(os.getloadavg()[0], 2)}
    for model in a.models.split(","):
        best_t = best_c = None
        torch_runs, ctrain_runs = [], []
        for threads, blas in settings:
            r = run_torch(model, threads, blas, a.steps, a.batch, a.bf16)
            torch_runs.append(r)
            r["epoch_s"] = r["step_s"] * steps_per_epoch
            emit(framework="pytorch", model=model, torch_threads=threads, openblas_threads=blas,
                 **{k: round(v, 4) for k, v in r.items()}, **common)
            if best_t is None or r["epoch_s"] < best_t["epoch_s"]:
                best_t = dict(r, torch_threads=threads, openblas_threads=blas)
            if a.baseline_build:   # the tree before a change, interleaved with PyTorch's runs
                rb = run_ctrain(a.baseline_build, model, threads, a.steps, a.batch, a.bf16)
                rb["epoch_s"] = rb["step_s"] * steps_per_epoch
                emit(framework="ctrain-baseline", model=model, threads=threads,
                     **{k: round(v, 4) for k, v in rb.items()}, **common)
        for threads in (1, 2):
            r = run_ctrain(a.build, model, threads, a.steps, a.batch, a.bf16)
            ctrain_runs.append(r)
            r["epoch_s"] = r["step_s"] * steps_per_epoch
            emit(framework="ctrain", model=model, threads=threads,
                 **{k: round(v, 4) for k, v in r.items()}, **common)
            if best_c is None or r["epoch_s"] < best_c["epoch_s"]:
                best_c = dict(r, threads=threads)
        epoch_ratio = best_c["epoch_s"] / best_t["epoch_s"]
        target = TARGET_EPOCH_AT_128[model] if a.batch == 128 else 1.0
        best_cpu_t = min(r_["cpu_step_s"] for r_ in torch_runs)
        best_cpu_c = min(r_["cpu_step_s"] for r_ in ctrain_runs)
        rss_ratio = best_c["peak_rss_bytes"] / best_t["peak_rss_bytes"]
        emit(model=model, summary=True, ctrain_epoch_s=round(best_c["epoch_s"], 3),
             pytorch_epoch_s=round(best_t["epoch_s"], 3), epoch_time_ratio=round(epoch_ratio, 3),
             epoch_time_target=target, epoch_time_ok=epoch_ratio <= target,
             cpu_step_ratio=round(best_cpu_c / best_cpu_t, 3), ctrain_cpu_step_s=round(best_cpu_c, 4),
             pytorch_cpu_step_s=round(best_cpu_t, 4),
             ctrain_peak_rss_bytes=best_c["peak_rss_bytes"], pytorch_peak_rss_bytes=best_t["peak_rss_bytes"],
             peak_rss_ratio=round(rss_ratio, 3), peak_rss_ok=rss_ratio <= 0.3,
             ctrain_first_step_s=best_c["first_step_s"], first_step_ok=best_c["first_step_s"] <= 0.5,
             pytorch_first_step_s=round(best_t["first_step_s"], 3),
             pytorch_best={"torch_threads": best_t["torch_threads"], "openblas_threads": best_t["openblas_threads"]},
             ctrain_best_threads=best_c["threads"], **common)


if __name__ == "__main__":
    main()
