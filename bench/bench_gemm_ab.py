#!/usr/bin/python3
"""One ctrain binary with every GEMM on OpenBLAS (CTRAIN_CPU_GEMM=openblas) against the default
per-shape choice (oneDNN where it measured faster; core/cpu/cpu_gemm.c), interleaved.

    /usr/bin/python3 bench/bench_gemm_ab.py BUILD MODEL BATCH STEPS ROUNDS THREADS
    e.g. bench/bench_gemm_ab.py build cnn 128 40 3 1

MODEL is mlp or cnn (configs/fmnist_MODEL.json). Per round and variant: CPU seconds per step, the
difference of the process CPU time (user + system) of a run of STEPS steps and of one of STEPS // 5
steps, per step in between (on a machine shared with other jobs, CPU time says more than wall
time), and the run's peak resident memory. One JSON line per variant.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile


def run_once(build, model, batch, steps, threads, gemm):
    with tempfile.TemporaryDirectory() as d:
        cmd = [os.path.join(build, "ctrain"), "--config", f"configs/fmnist_{model}.json", "--quiet",
               "--summary", f"{d}/s.json", "--set", f"train.max_steps={steps}", "--set", f"train.threads={threads}",
               "--set", f"train_batch_size={batch}", "--set", f"train_micro_batch_size_per_gpu={batch}",
               "--set", "data.eval.limit=128", "--set", f"train.run_dir={d}/run"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(cmd, env=dict(os.environ, CTRAIN_CPU_GEMM=gemm), check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(f"{d}/s.json") as f:
            summary = json.load(f)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, summary


def main():
    build, model = sys.argv[1], sys.argv[2]
    batch, steps, rounds, threads = (int(v) for v in sys.argv[3:7])
    short = steps // 5
    results = {"openblas": [], "auto": []}
    for _ in range(rounds):
        for gemm in results:
            cpu_long, summary = run_once(build, model, batch, steps, threads, gemm)
            cpu_short, _ = run_once(build, model, batch, short, threads, gemm)
            results[gemm].append(((cpu_long - cpu_short) / (steps - short), summary["peak_host_bytes"]))
    for gemm, runs in results.items():
        cpu = sorted(r[0] for r in runs)
        print(json.dumps({"model": model, "batch": batch, "threads": threads, "gemm": gemm,
                          "cpu_ms_per_step": [round(c * 1e3, 2) for c in cpu],
                          "median_cpu_ms": round(cpu[len(cpu) // 2] * 1e3, 2),
                          "peak_rss_mb": round(max(r[1] for r in runs) / 1e6, 1),
                          "load": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
