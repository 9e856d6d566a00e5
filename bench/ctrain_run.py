"""One measured ctrain run for the CPU benchmarks (bench_ckpt.py, bench_head.py): the config
written to a temporary folder, `ctrain --quiet` run on it, and what the benchmarks compare."""
import json
import os
import resource
import subprocess
import tempfile


def measure(build, cfg):
    """Train cfg (a config dict) with build/ctrain. Returns a dict: the summary line (summary),
    the step times of wall_clock_breakdown after the first two steps (step_ms, a list), the run's
    CPU seconds (user + system of the child, cpu_s) and the load average when it started (load)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        out = subprocess.run([os.path.join(build, "ctrain"), "--quiet", "--config", path, "--set",
                              "train.run_dir=" + os.path.join(tmp, "run")], capture_output=True, text=True,
                             check=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        step_ms = []
        with open(os.path.join(tmp, "run", "metrics.jsonl")) as f:
            for line in f:
                rec = json.loads(line)
                if "step_ms" in rec and rec.get("step", 0) > 2:
                    step_ms.append(rec["step_ms"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"summary": json.loads(out.strip().splitlines()[-1]), "step_ms": step_ms, "cpu_s": cpu, "load": load}
