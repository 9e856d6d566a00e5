#!/usr/bin/env python3
"""Convert Parquet files (Hugging Face datasets' format) into ctrain shards.

Usage: datasets/parquet_to_shards.py FILE.parquet... --out DIR [--image COLUMN] [--label COLUMN]
                                     [--ctrain CMD] [--shard-size MB] [--compress] [--keep-h5 FILE]

ctrain has no Parquet reader: Parquet is columnar, compressed per column chunk, and no C library
for it is packaged in Debian 12 (nor pyarrow). This script reads the files with pyarrow (pip
install pyarrow), in the order given, row by row, and writes the rows as an HDF5 file with h5py
(uint8 "images", int64 "labels"), which `ctrain pack --from hdf5` turns into shards; the temporary
HDF5 file is removed unless --keep-h5 names where to keep it.

Columns (defaults: "image" and "label"):
  - image: encoded images as Hugging Face stores them (a struct {"bytes": PNG/JPEG, "path": ...},
    or the bytes themselves), decoded with Pillow, gray images to [H, W], others to RGB [3, H, W];
    or numbers (a list per row, or a fixed-size list), 8-bit values 0..255 as uint8 [n];
  - label: integer class indices >= 0.
Every row must give the first row's shape. Errors name the file, the row and the column, and exit
1 (exit 2 for usage). Needs pyarrow, h5py (python3-h5py), numpy, and Pillow for encoded images.
"""
import argparse
import io
import os
import shlex
import subprocess
import sys
import tempfile


def fail(msg, code=1):
    print(f"parquet_to_shards.py: {msg}", file=sys.stderr)
    sys.exit(code)


def decode_image(value, where):
    """One row's image as a uint8 array: [H, W] gray, [3, H, W] color, or [n] numbers."""
    import numpy as np
    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, (bytes, bytearray)):
        from PIL import Image
        try:
            im = Image.open(io.BytesIO(value))
            im.load()
        except Exception as e:  # Pillow raises several kinds for a corrupt image
            fail(f"{where}: not a PNG or JPEG Pillow can decode: {e}")
        if im.mode in ("L", "1", "I;16", "I", "F"):
            return np.asarray(im.convert("L"), dtype=np.uint8)
        return np.asarray(im.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1)
    if isinstance(value, (list, tuple)):
        a = np.asarray(value)
        if a.size == 0 or not np.issubdtype(a.dtype, np.number) or a.min() < 0 or a.max() > 255:
            fail(f"{where}: expected 8-bit values 0..255 (or encoded image bytes)")
        return a.astype(np.uint8).reshape(-1)
    fail(f"{where}: expected image bytes, a {{'bytes': ...}} struct or a list of numbers, got {type(value).__name__}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--image", default="image")
    ap.add_argument("--label", default="label")
    ap.add_argument("--ctrain", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "ctrain"))
    ap.add_argument("--shard-size", default=None)
    ap.add_argument("--compress", action="store_true")
    ap.add_argument("--keep-h5", default=None)
    a = ap.parse_args()
    try:
        import h5py
        import numpy as np
        import pyarrow.parquet as pq
    except ImportError as e:
        fail(f"{e}: needs pyarrow (pip install pyarrow; Debian 12 has no package), h5py (apt-get install "
             "python3-h5py) and numpy", 2)
    if a.keep_h5:
        h5_path = a.keep_h5
    else:
        fd, h5_path = tempfile.mkstemp(suffix=".h5", prefix="parquet_to_shards_")
        os.close(fd)  # h5py writes it anew
    rows = 0
    shape = None
    try:
        with h5py.File(h5_path, "w") as h5:
            images = labels = None
            for path in a.files:
                try:
                    pf = pq.ParquetFile(path)
                except Exception as e:  # pyarrow's errors for a missing or corrupt file
                    fail(f"{path}: cannot read it as Parquet: {e}")
                names = pf.schema_arrow.names
                for col in (a.image, a.label):
                    if col not in names:
                        fail(f"{path}: no column \"{col}\"; it has: {', '.join(names)} (use --image / --label)", 2)
                for batch in pf.iter_batches(columns=[a.image, a.label], batch_size=4096):
                    xs, ys = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                    block = []
                    for k, (x, y) in enumerate(zip(xs, ys)):
                        where = f"{path}: row {rows + k}"
                        img = decode_image(x, f"{where}, column \"{a.image}\"")
                        if shape is None:
                            shape = img.shape
                            images = h5.create_dataset("images", shape=(0,) + shape, maxshape=(None,) + shape,
                                                       dtype="uint8", chunks=(64,) + shape)
                            labels = h5.create_dataset("labels", shape=(0,), maxshape=(None,), dtype="int64")
                        if img.shape != shape:
                            fail(f"{where}, column \"{a.image}\": shape {list(img.shape)}, the first row's is {list(shape)}")
                        if not isinstance(y, int) or isinstance(y, bool) or y < 0:
                            fail(f"{where}, column \"{a.label}\": {y!r} is not a class index (an integer >= 0)")
                        block.append(img)
                    if block:
                        n = len(block)
                        images.resize(rows + n, axis=0)
                        labels.resize(rows + n, axis=0)
                        images[rows:rows + n] = np.stack(block)
                        labels[rows:rows + n] = np.asarray(ys, dtype=np.int64)
                        rows += n
        if rows == 0:
            fail(f"{', '.join(a.files)}: no rows")
        cmd = shlex.split(a.ctrain) + ["pack", "--from", "hdf5", h5_path, "--out", a.out]
        if a.shard_size:
            cmd += ["--shard-size", a.shard_size]
        if a.compress:
            cmd.append("--compress")
        r = subprocess.run(cmd)
        if r.returncode != 0:
            sys.exit(r.returncode)
    finally:
        if not a.keep_h5 and os.path.exists(h5_path):
            os.unlink(h5_path)


if __name__ == "__main__":
    main()
