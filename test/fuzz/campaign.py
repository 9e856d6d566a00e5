#!/usr/bin/python3
"""Property campaigns over the hardening classes: the run as a whole under random faults.

    /usr/bin/python3 test/fuzz/campaign.py TARGET SECONDS [--seed N] [--build build]

TARGET is one of
  signals   SIGINT/SIGTERM/SIGHUP (one or two) at random moments of a run with periodic saves,
            then `--resume auto` until it ends. Properties: every exit code is documented, every
            run ends by itself (no hang), every stop prints its summary line, and the final weights
            are byte-identical to an uninterrupted run's (nothing lost, nothing trained twice).
  mismatch  a checkpoint, then a resume under a changed config (a random mix of: learning rate,
            micro-batch, accumulation, a layer's width, the optimizer, the precision, the seed, the
            data) or a damaged checkpoint file. Properties: exit 0, 2 or 3 only; 0 only for changes
            a resume may absorb, with the changes listed; 2/3 name the file or setting; never a
            crash or a hang; a damaged tensor file is refused (exit 3, its checksum); the
            checkpoint directory is unchanged by a refused resume.
  paths     output paths drawn from a bag of bad ones (missing parents, a file where a directory
            goes, read-only directories, the config or a data file, a checkpoint's files, the run
            directory's config.json and lock, null and full device nodes made in the scratch
            directory, a link to a file, symlinks, long names) for
            train.run_dir, train.save_dir, --summary and export --out. Properties: exit 0 or 2
            (1 only for the full device), a refusal comes before any training step, no input
            file or checkpoint changes, devices and links stay what they were, no partial summary.
  limits    random address-space, file-size and open-file limits. Properties: a documented exit
            code, a message on stderr for every failure, no hang, no crash.

Each run has a watchdog (a hang is a finding). Findings are printed as they happen and counted at
the end; the exit status is 1 when there was any. Not part of `make test` (minutes per target);
docs/BENCHMARKS.md and the issue notes record campaigns that were run."""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

DOCUMENTED = {0, 1, 2, 3, 4, 129, 130, 143}


class Campaign:
    def __init__(self, build, seed, workdir):
        self.bin = os.path.abspath(os.path.join(build, "ctrain"))
        self.rng = random.Random(seed)
        self.dir = workdir
        self.runs = 0
        self.outcomes = {}
        self.findings = []
        self.data = self.make_data()

    # ---- fixtures -------------------------------------------------------------------------
    def make_data(self):
        """A small IDX data set: 512 random 8x8 images, 4 classes (seconds to train)."""
        rng = random.Random(7)
        n, h, w = 512, 8, 8
        d = os.path.join(self.dir, "data")
        os.makedirs(d, exist_ok=True)
        pix = bytes(rng.randrange(256) for _ in range(n * h * w))
        lab = bytes(rng.randrange(4) for _ in range(n))
        with open(os.path.join(d, "images"), "wb") as f:
            f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, h, w) + pix)
        with open(os.path.join(d, "labels"), "wb") as f:
            f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + lab)
        return d

    def config(self, run_dir, **over):
        cfg = {
            "train_batch_size": 32, "train_micro_batch_size_per_gpu": 16,
            "optimizer": {"type": "Adam", "params": {"lr": 0.003}},
            "model": {"input": [1, 8, 8], "loss": {"type": "cross_entropy"}, "layers": [
                {"type": "flatten", "name": "f"}, {"type": "linear", "name": "fc1", "out": 32},
                {"type": "relu", "name": "r"}, {"type": "linear", "name": "fc2", "out": 4}]},
            "data": {"train": {"format": "idx", "images": os.path.join(self.data, "images"),
                               "labels": os.path.join(self.data, "labels")},
                     "eval": {"format": "idx", "images": os.path.join(self.data, "images"),
                              "labels": os.path.join(self.data, "labels"), "limit": 64}},
            "train": {"max_steps": 40, "save_interval": 5, "eval_interval": 10, "seed": 3,
                      "device": "cpu", "threads": 1, "run_dir": run_dir},
        }
        for path, value in over.items():
            node = cfg
            keys = path.split(".")
            for k in keys[:-1]:
                node = node[int(k)] if isinstance(node, list) else node.setdefault(k, {})
            node[keys[-1]] = value
        return cfg

    def write_config(self, cfg, name="c.json"):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    # ---- running and judging --------------------------------------------------------------
    def run(self, args, timeout=60, preexec=None, on_start=None):
        """Run ctrain; returns (exit code or -signal, stdout, stderr, seconds). None on a hang."""
        self.runs += 1
        t0 = time.time()
        p = subprocess.Popen([self.bin] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=preexec, cwd=self.dir)
        if on_start:
            on_start(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            self.finding("hang", args, f"killed after {timeout} s", err)
            return None
        return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), time.time() - t0

    def finding(self, kind, args, what, err=b""):
        tail = err.decode(errors="replace") if isinstance(err, bytes) else err
        self.findings.append((kind, args, what))
        print(f"FINDING [{kind}] {what}\n  ctrain {' '.join(args)}\n  " +
              "\n  ".join(tail.strip().splitlines()[-4:]), flush=True)

    def count(self, outcome):
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def judge_exit(self, r, args):
        """Common properties: a documented code, a message for every failure."""
        if r is None:
            return False
        code, out, err, _ = r
        if code < 0:
            self.finding("crash", args, f"killed by signal {-code}", err)
            return False
        if code not in DOCUMENTED:
            self.finding("exit", args, f"undocumented exit code {code}", err)
            return False
        if code not in (0, 129, 130, 143) and "ctrain: error:" not in err:
            self.finding("silent", args, f"exit {code} without an error message", err)
            return False
        return True

    @staticmethod
    def digest(path):
        if not os.path.exists(path):
            return None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            h.update(f.read())
        return h.hexdigest()

    def final_weights(self, run_dir):
        latest = os.path.join(run_dir, "checkpoints", "latest")
        if not os.path.exists(latest):
            return None
        tag = open(latest).read().strip()
        return self.digest(os.path.join(run_dir, "checkpoints", tag, "model.safetensors"))

    # ---- targets --------------------------------------------------------------------------
    SIGNAL_RUN = {"train.max_steps": 120, "train.save_interval": 7, "model.layers.1.out": 256}

    def reference(self):
        """The uninterrupted run: its final weights and how long it took."""
        if not hasattr(self, "_ref"):
            rd = os.path.join(self.dir, "ref")
            r = self.run(["--quiet", "--config",
                          self.write_config(self.config(rd, **self.SIGNAL_RUN), "ref.json")])
            assert r and r[0] == 0, r
            self._ref = (self.final_weights(rd), r[3])
            self.ref_dir = rd
        return self._ref

    def target_signals(self):
        want, secs = self.reference()
        rd = os.path.join(self.dir, "sig")
        shutil.rmtree(rd, ignore_errors=True)
        cfg = self.write_config(self.config(rd, **self.SIGNAL_RUN), "sig.json")
        stops = 0
        for attempt in range(12):
            args = ["--config", cfg, "--resume", "auto", "--set", "steps_per_print=1"]
            sigs = self.rng.choice([[signal.SIGTERM], [signal.SIGINT], [signal.SIGHUP],
                                    [signal.SIGINT, signal.SIGINT], []])
            # anywhere in a whole run: set-up, a step, a save, an eval, the end
            delay = self.rng.uniform(0.03, 1.1 * secs)

            def hit(p, sigs=sigs, delay=delay):
                time.sleep(delay)
                for s in sigs:
                    if p.poll() is None:
                        p.send_signal(s)
                        time.sleep(self.rng.uniform(0.0, 0.2))

            r = self.run(args, on_start=hit)
            if r and r[0] == -sigs[0] if sigs else False:
                if not r[2]:   # before main installed its handlers: the default action, as for any program
                    self.count("killed before the handlers were installed")
                    continue
            if not self.judge_exit(r, args):
                return
            code, out, err, _ = r
            if '{"status":' not in out:
                self.finding("summary", args, f"exit {code} without a summary line on stdout", err)
                return
            self.count(f"exit {code}")
            if code in (129, 130, 143):
                stops += 1
                continue
            if code == 0:
                got = self.final_weights(rd)
                if got != want:
                    self.finding("loss", args, f"after {stops} stops the final weights differ from "
                                 "an uninterrupted run's", err)
                else:
                    self.count("resumed to the same bits")
                return
        self.finding("stuck", [cfg], "12 attempts did not finish the run")

    MISMATCH_OK = {"optimizer.params.lr": 0.001, "train.seed": 4, "train_micro_batch_size_per_gpu": 8}

    def target_mismatch(self):
        rd = os.path.join(self.dir, "mm")
        shutil.rmtree(rd, ignore_errors=True)
        base = self.config(rd, **{"train.max_steps": 10})
        r = self.run(["--quiet", "--config", self.write_config(base, "mm.json")])
        if not self.judge_exit(r, ["mm.json"]) or r[0] != 0:
            return
        changes = {
            "optimizer.params.lr": self.rng.choice([0.001, 0.01]),
            "train.seed": self.rng.randrange(100),
            "train_micro_batch_size_per_gpu": self.rng.choice([8, 32]),
            "gradient_accumulation_steps": self.rng.choice([1, 2, 4]),
            "model.layers.1.out": self.rng.choice([16, 64]),
            "optimizer.type": self.rng.choice(["SGD", "AdamW", "Lamb"]),
            "bf16.enabled": True,
            "fp16.enabled": True,
            "train.max_steps": 20,
        }
        pick = self.rng.sample(sorted(changes), self.rng.randint(0, 3))
        over = {k: changes[k] for k in pick}
        if "bf16.enabled" in over and "fp16.enabled" in over:
            del over["fp16.enabled"]
        if "gradient_accumulation_steps" in over:
            over["train_batch_size"] = over.get("train_micro_batch_size_per_gpu", 16) * over["gradient_accumulation_steps"]
        over.setdefault("train.max_steps", 20)
        ck = os.path.join(rd, "checkpoints")
        tag = open(os.path.join(ck, "latest")).read().strip()
        damage = self.rng.random() < 0.3
        victim = None
        if damage:
            victim = os.path.join(ck, tag, self.rng.choice(["model.safetensors", "optimizer.safetensors", "state.json"]))
            data = bytearray(open(victim, "rb").read())
            for _ in range(self.rng.randint(1, 4)):
                i = self.rng.randrange(len(data))
                data[i] ^= 1 << self.rng.randrange(8)
            with open(victim, "wb") as f:
                f.write(data)
        before = {n: self.digest(os.path.join(ck, tag, n)) for n in os.listdir(os.path.join(ck, tag))}
        cfg = self.write_config(self.config(rd, **over), "mm2.json")
        args = ["--quiet", "--config", cfg, "--resume", os.path.join(ck, tag)]
        r = self.run(args)
        if not self.judge_exit(r, args):
            return
        code, out, err, _ = r
        self.count(f"{'damaged ' + os.path.basename(victim) + ' ' if damage else ''}exit {code}")
        if damage and victim.endswith(".safetensors") and code != 3:
            # the tensor files carry a CRC-32 in COMPLETE: a flipped bit is never trained on
            self.finding("corrupt", args, f"a damaged {os.path.basename(victim)} gave exit {code}, not 3", err)
        if damage and victim.endswith("state.json") and code == 0 and "state.json changed" not in err:
            self.finding("silent", args, "a damaged state.json resumed without a warning", err)
        if code not in (0, 2, 3):
            self.finding("exit", args, f"resume under {over} damaged={damage}: exit {code}", err)
        after = {n: self.digest(os.path.join(ck, tag, n)) for n in before}
        if code != 0 and before != after:
            self.finding("loss", args, "a refused resume changed the checkpoint it refused", err)

    def bad_paths(self, scratch):
        ro = os.path.join(scratch, "ro")
        os.makedirs(ro, exist_ok=True)
        os.chmod(ro, 0o555)
        afile = os.path.join(scratch, "a_file")
        open(afile, "w").write("x")
        link = os.path.join(scratch, "link")
        if not os.path.lexists(link):
            os.symlink(os.path.join(scratch, "nowhere", "deeper"), link)
        ck = os.path.join(self.ref_dir, "checkpoints")
        tag = open(os.path.join(ck, "latest")).read().strip()
        # device nodes of our own (never /dev's: a regression would replace them), a link to a
        # file; each must still be what it was after the run
        specials = []
        for name, minor in (("null", 3), ("full", 7)):
            dev = os.path.join(scratch, name)
            try:
                os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, minor))
                specials.append(dev)
            except OSError:
                pass
        target = os.path.join(scratch, "target.json")
        open(target, "w").write("{}\n")
        os.symlink(target, os.path.join(scratch, "to_file"))
        specials.append(os.path.join(scratch, "to_file"))
        self.specials = specials
        return specials + [os.path.join(scratch, "new", "deeper", "dir"), afile, os.path.join(afile, "sub"), ro,
                os.path.join(ro, "sub"), link, os.path.join(scratch, "x" * 300),
                os.path.join(self.data, "images"), os.path.join(self.data, "labels"),
                os.path.join(self.dir, "paths.json"), os.path.join(ck, "latest"),
                os.path.join(ck, tag, "model.safetensors"), os.path.join(ck, tag),
                os.path.join(self.ref_dir, "config.json"), os.path.join(self.ref_dir, ".lock"),
                scratch, os.path.join(scratch, "ok")]

    def inputs(self, which):
        """Files the command reads, which it must not change: a training run's data (its config is
        checked apart), export's checkpoint. Other existing files that an output path names are
        the user's to replace (as cp would), except the run's own (checked by the properties)."""
        if which != "export":
            return [os.path.join(self.data, "images"), os.path.join(self.data, "labels")]
        files = []
        for root, _, names in os.walk(os.path.join(self.ref_dir, "checkpoints")):
            files += [os.path.join(root, n) for n in sorted(names)]
        return files

    def ref_files(self):
        return {p: self.digest(p) for p in self.inputs("export")}

    def target_paths(self):
        self.reference()
        scratch = tempfile.mkdtemp(dir=self.dir)
        bags = self.bad_paths(scratch)
        over = {"train.max_steps": 4}
        which = self.rng.choice(["run_dir", "save_dir", "summary", "export"])
        inputs = self.inputs(which)
        before = [self.digest(p) for p in inputs]
        ref_before = self.ref_files()
        data_files = self.inputs("run_dir")
        data_before = [self.digest(p) for p in data_files]
        path = self.rng.choice(bags)
        cf = os.path.join(self.dir, "paths.json")
        if which == "export":
            args = ["export", "--checkpoint", os.path.join(self.ref_dir, "checkpoints"), "--out", path]
            self.write_config(self.config(os.path.join(scratch, "run"), **over), "paths.json")
        else:
            args = ["--quiet"]
            if which == "summary":
                cfg = self.config(os.path.join(scratch, "run"), **over)
                args += ["--summary", path]
            else:
                cfg = self.config(os.path.join(scratch, "run") if which == "save_dir" else path, **over)
                if which == "save_dir":
                    cfg["train"]["save_dir"] = path
            self.write_config(cfg, "paths.json")
            args += ["--config", cf, "--set", "steps_per_print=1"]
        config_before = self.digest(cf)
        r = self.run(args)
        if self.judge_exit(r, args):
            code, out, err, _ = r
            self.count(f"{which} exit {code}")
            if code not in (0, 1, 2):
                self.finding("exit", args, f"{which}={path}: exit {code}", err)
            if code == 1 and not path.endswith("/full"):
                self.finding("exit", args, f"{which}={path}: exit 1 (a path the user must fix is 2)", err)
            if code == 2 and "step 1/" in err:
                self.finding("late", args, f"{which}={path} refused after training started", err)
            after = [self.digest(p) for p in inputs]
            config_changed = which != "export" and self.digest(cf) != config_before
            if after != before or config_changed:
                changed = [p for p, a, b in zip(inputs, after, before) if a != b]
                if config_changed:
                    changed.append(cf)
                self.finding("loss", args, f"{which}={path}: input files changed: {changed}", err)
                self.data = self.make_data()   # intact inputs again: one finding counts once
            kinds = {os.path.basename(p): (os.path.islink(p), stat.S_IFMT(os.lstat(p).st_mode))
                     for p in self.specials if os.path.lexists(p)}
            if len(kinds) != len(self.specials) or any(
                    (k == "to_file") != v[0] or (k != "to_file" and v[1] != stat.S_IFCHR)
                    for k, v in kinds.items()):
                self.finding("loss", args, f"{which}={path}: a device node or a link was replaced: {kinds}", err)
            if which == "summary" and os.path.isfile(path) and path not in inputs + [cf]:
                text = open(path).read()
                if text and not text.endswith("}\n"):
                    self.finding("partial", args, f"--summary {path} holds a partial line", err)
        if [self.digest(p) for p in data_files] != data_before:   # export --out replaced one
            self.data = self.make_data()
        if self.ref_files() != ref_before:   # a path of the bag replaced one of its files
            shutil.rmtree(self.ref_dir, ignore_errors=True)
            del self._ref
            self.reference()
        os.chmod(os.path.join(scratch, "ro"), 0o755)
        shutil.rmtree(scratch, ignore_errors=True)

    def target_limits(self):
        kind = self.rng.choice(["as", "fsize", "nofile"])
        value = {"as": self.rng.choice([50_000, 120_000, 300_000, 600_000, 900_000, 2_000_000]) * 1024,
                 "fsize": self.rng.choice([1, 16, 200, 2000, 100000]) * 1024,
                 "nofile": self.rng.choice([8, 12, 16, 24, 64])}[kind]
        res = {"as": 9, "fsize": 1, "nofile": 7}[kind]   # RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NOFILE

        def limit():
            import resource
            resource.setrlimit(res, (value, value))
            if kind == "fsize":
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        rd = os.path.join(self.dir, "lim")
        shutil.rmtree(rd, ignore_errors=True)
        args = ["--quiet", "--config", self.write_config(self.config(rd, **{"train.max_steps": 10}), "lim.json")]
        r = self.run(args, preexec=limit)
        if r is None:
            return
        code = r[0]
        if code == 127:   # the dynamic loader itself could not map the program's libraries
            self.count(f"{kind} exit 127 (loader)")
            return
        if self.judge_exit(r, args + [f"(limit {kind}={value})"]):
            self.count(f"{kind} exit {code}")
            if code == 3:   # a resource limit is not bad data
                self.finding("exit", args + [f"(limit {kind}={value})"], "exit 3 (data error) under a resource limit", r[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target", choices=["signals", "mismatch", "paths", "limits"])
    ap.add_argument("seconds", type=float)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--build", default="build")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time())
    work = tempfile.mkdtemp(prefix=f"ct-campaign-{a.target}-")
    print(f"campaign {a.target}: seed {seed} (--seed {seed} repeats it), {a.seconds:.0f} s, in {work}",
          flush=True)
    c = Campaign(a.build, seed, work)
    t_end = time.time() + a.seconds
    rounds = 0
    while time.time() < t_end:
        getattr(c, "target_" + a.target)()
        rounds += 1
    print(f"campaign {a.target}: {rounds} rounds, {c.runs} runs of ctrain, {len(c.findings)} findings")
    for k in sorted(c.outcomes):
        print(f"  {k}: {c.outcomes[k]}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if c.findings else 0)


if __name__ == "__main__":
    main()
