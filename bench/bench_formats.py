#!/usr/bin/python3
"""Dataset-format throughput in one run: ctrain's loader against PyTorch's reader for each format.

Usage: python3 bench/bench_formats.py [--workers N] [--batch B] [--repeat R] [--ctrain CMD] [--dir DIR]

Fashion-MNIST's 60,000 training images (Debian's dataset-fashion-mnist) are written once into DIR
(default: a temporary directory) as:
  - an HDF5 file by h5py, uint8 "images" [60000, 28, 28] + int64 "labels", contiguous (h5py's
    default) and a second one chunked by 64 samples with shuffle + gzip;
  - ctrain shards (`ctrain pack --from idx`);
  - 8 WebDataset tar shards of PNG + .cls samples (Python's tarfile; the PNGs by test/make_wds.py).
Each pipeline then reads one shuffled epoch with N workers, decodes to 1-channel float [1, 28, 28],
normalises (mean 0.2860, std 0.3530) and collates batches of B, no model; R runs each, interleaved
(the best and all runs are printed, one JSON line per run and a summary per pipeline):
  - ctrain: `ctrain bench-data` (threads) on hdf5 (both files), shard, webdataset (with
    data.shuffle_buffer 1000, the streaming shuffle WebDataset does);
  - torch h5py: a map-style Dataset whose __getitem__ reads f["images"][i] and f["labels"][i] from
    the file opened once per worker process (h5py's documented pattern for DataLoader workers),
    DataLoader(shuffle=True, num_workers=N);
  - torch webdataset: webdataset.WebDataset(shards, shardshuffle=True).shuffle(1000)
    .decode("l8").to_tuple("png", "cls"), batched in the workers, DataLoader(batch_size=None); when
    the webdataset package is missing, an IterableDataset over Python's tarfile doing the same
    (shards split across workers, a shuffle buffer of 1000, PIL decoding), and the output says so.
The page cache is warm for every run (the files are read once before timing). The torch times
include the worker start, as ctrain's include the loader start; neither includes opening the file.
"""
import argparse
import gzip
import io
import json
import os
import random
import shlex
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

MEAN, STD = 0.2860, 0.3530
FMNIST = "/usr/share/datasets/fashion-mnist"
HERE = os.path.dirname(os.path.abspath(__file__))


def idx_array(path):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def prepare(d, ctrain):
    import h5py
    sys.path.insert(0, os.path.join(HERE, "..", "test"))
    sys.dont_write_bytecode = True
    from make_wds import png_gray
    x = idx_array(f"{FMNIST}/train-images-idx3-ubyte.gz")
    y = idx_array(f"{FMNIST}/train-labels-idx1-ubyte.gz").astype("int64")
    if not os.path.exists(f"{d}/fmnist.h5"):
        with h5py.File(f"{d}/fmnist.h5", "w") as f:
            f.create_dataset("images", data=x)
            f.create_dataset("labels", data=y)
        with h5py.File(f"{d}/fmnist-gzip.h5", "w") as f:
            f.create_dataset("images", data=x, chunks=(64, 28, 28), shuffle=True, compression="gzip")
            f.create_dataset("labels", data=y)
    if not os.path.exists(f"{d}/shards"):
        subprocess.run(shlex.split(ctrain) + ["pack", "--from", "idx", f"{FMNIST}/train-images-idx3-ubyte.gz",
                                              "--out", f"{d}/shards"], check=True, capture_output=True)
    if not os.path.exists(f"{d}/wds-7.tar"):
        per = (len(x) + 7) // 8
        for s in range(8):
            with tarfile.open(f"{d}/wds-{s}.tar", "w") as t:
                for i in range(s * per, min(len(x), (s + 1) * per)):
                    for ext, data in (("png", png_gray(28, 28, x[i].tobytes())), ("cls", str(int(y[i])).encode())):
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size = len(data)
                        t.addfile(info, io.BytesIO(data))
    for name in os.listdir(d):  # warm the page cache
        p = os.path.join(d, name)
        for f in [os.path.join(p, q) for q in os.listdir(p)] if os.path.isdir(p) else [p]:
            with open(f, "rb") as fh:
                while fh.read(1 << 20):
                    pass


def run_ctrain(ctrain, name, entry, workers, batch, extra=None):
    data = {"train": entry, "workers": workers, "shuffle": True, "drop_last": False,
            "transform": {"normalize": {"mean": [MEAN], "std": [STD]}}}
    data.update(extra or {})
    cfg = {"train_batch_size": batch, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "data": data}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
        path = f.name
    try:
        out = subprocess.run(shlex.split(ctrain) + ["bench-data", "--config", path, "--workers", str(workers)],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    r = json.loads(out.strip().splitlines()[-1])
    return {"impl": name, "samples": r["samples"], "seconds": r["seconds"], "samples_per_s": r["samples_per_s"]}


class H5Images:
    """h5py map-style Dataset: the file opened lazily in each worker (h5py handles do not survive fork)."""

    def __init__(self, path):
        self.path, self.f = path, None
        import h5py
        with h5py.File(path, "r") as f:
            self.n = len(f["labels"])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py
        import torch
        if self.f is None:
            self.f = h5py.File(self.path, "r")
            self.x, self.y = self.f["images"], self.f["labels"]
        x = torch.from_numpy(self.x[i]).float().div_(255).sub_(MEAN).div_(STD).unsqueeze_(0)
        return x, int(self.y[i])


def to_tensor(px):
    import torch
    return torch.tensor(px, dtype=torch.float32).div_(255).sub_(MEAN).div_(STD).unsqueeze_(0)  # px may be read-only


def tar_samples(urls, buffer, seed):
    """The tarfile stand-in for webdataset: this worker's shards, members grouped by key, a shuffle buffer."""
    import numpy as np
    import torch
    from PIL import Image
    info = torch.utils.data.get_worker_info()
    mine = urls[info.id::info.num_workers] if info else list(urls)
    rng = random.Random(seed + (info.id if info else 0))
    rng.shuffle(mine)
    buf = []
    for u in mine:
        with tarfile.open(u) as t:
            sample = {}
            for m in t:
                key, ext = m.name.split(".", 1)
                sample[ext] = t.extractfile(m).read()
                if "png" in sample and "cls" in sample:
                    px = np.asarray(Image.open(io.BytesIO(sample["png"])).convert("L"))
                    item = (to_tensor(px), int(sample["cls"]))
                    sample = {}
                    if len(buf) < buffer:
                        buf.append(item)
                        continue
                    k = rng.randrange(len(buf))
                    buf[k], item = item, buf[k]
                    yield item
    rng.shuffle(buf)
    yield from buf


def run_torch(name, make_ds, workers, batch, **dl):
    import torch
    t0 = time.perf_counter()
    ds = make_ds()
    loader = torch.utils.data.DataLoader(ds, num_workers=workers, **dl) if dl.get("batch_size", 1) is None \
        else torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, **dl)
    n = 0
    for x, y in loader:
        n += x.shape[0]
    secs = time.perf_counter() - t0
    return {"impl": name, "samples": n, "seconds": round(secs, 4), "samples_per_s": round(n / secs, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ctrain", default="build/ctrain")
    ap.add_argument("--dir", default=None, help="where the files are written (kept); default: a temporary directory")
    a = ap.parse_args()
    import torch
    d = a.dir or tempfile.mkdtemp(prefix="bench_formats_")
    os.makedirs(d, exist_ok=True)
    prepare(d, a.ctrain)
    try:
        import webdataset as wds
        wds_note = f"webdataset {getattr(wds, '__version__', '?')}"
    except ImportError:
        wds = None
        wds_note = "webdataset package missing: Python's tarfile IterableDataset instead"
    urls = [f"{d}/wds-{s}.tar" for s in range(8)]

    def torch_wds():
        if wds is None:
            class Tars(torch.utils.data.IterableDataset):
                def __iter__(self):
                    return tar_samples(urls, 1000, 5)
            return Tars()
        return (wds.WebDataset(urls, shardshuffle=True).shuffle(1000).decode("l8").to_tuple("png", "cls")
                .map_tuple(to_tensor, int).batched(a.batch))

    w, b = a.workers, a.batch
    pipelines = [
        ("ctrain hdf5 (contiguous)", lambda: run_ctrain(a.ctrain, "ctrain hdf5 (contiguous)",
                                                        {"format": "hdf5", "path": f"{d}/fmnist.h5"}, w, b)),
        ("ctrain hdf5 (gzip chunks)", lambda: run_ctrain(a.ctrain, "ctrain hdf5 (gzip chunks)",
                                                         {"format": "hdf5", "path": f"{d}/fmnist-gzip.h5"}, w, b)),
        ("ctrain shard", lambda: run_ctrain(a.ctrain, "ctrain shard", {"format": "shard", "path": f"{d}/shards"}, w, b)),
        ("torch h5py Dataset (contiguous)", lambda: run_torch("torch h5py Dataset (contiguous)",
                                                              lambda: H5Images(f"{d}/fmnist.h5"), w, b, shuffle=True)),
        ("torch h5py Dataset (gzip chunks)", lambda: run_torch("torch h5py Dataset (gzip chunks)",
                                                               lambda: H5Images(f"{d}/fmnist-gzip.h5"), w, b, shuffle=True)),
        ("ctrain webdataset", lambda: run_ctrain(a.ctrain, "ctrain webdataset",
                                                 {"format": "webdataset", "urls": f"{d}/wds-{{0..7}}.tar"}, w, b,
                                                 {"shuffle_buffer": 1000})),
        ("torch " + ("webdataset" if wds else "tarfile IterableDataset"),
         lambda: run_torch("torch " + ("webdataset" if wds else "tarfile IterableDataset"), torch_wds, w, b,
                           **({"batch_size": None} if wds else {}))),
    ]
    runs = {name: [] for name, _ in pipelines}
    for r in range(a.repeat):
        for name, fn in pipelines:
            res = fn()
            res.update(run=r, workers=w, batch=b)
            runs[name].append(res)
            print(json.dumps(res), flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg": load,
                      "torch": torch.__version__, "webdataset": wds_note, "dir": d}))
    best = {name: max(x["samples_per_s"] for x in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        print(f"{name:36s} best {best[name]:>10,.0f} samples/s   runs: "
              + " / ".join(f"{x['samples_per_s']:,.0f}" for x in rs))
    for mine, peer in (("ctrain hdf5 (contiguous)", "torch h5py Dataset (contiguous)"),
                       ("ctrain hdf5 (gzip chunks)", "torch h5py Dataset (gzip chunks)"),
                       ("ctrain webdataset", pipelines[-1][0])):
        print(f"ratio {mine} / {peer}: {best[mine] / best[peer]:.1f}x")


if __name__ == "__main__":
    main()
