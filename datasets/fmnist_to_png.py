#!/usr/bin/env python3
"""Convert Fashion-MNIST IDX files to a PNG folder: OUT/<split>/<label>/<n>.png (8-bit gray).

Usage: datasets/fmnist_to_png.py [--src DIR] [--out DIR] [--split train|t10k|both]

DIR defaults: --src /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist),
--out datasets/fmnist_png. Class directories are named 0..9, so the sorted order ctrain's
image_folder (and torchvision's ImageFolder) uses gives class index = label. Standard library
only (gzip, zlib, struct)."""
import argparse
import gzip
import os
import struct
import sys
import zlib


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        sys.exit(f"{path}: not a u8 IDX file (magic {data[:4].hex()})")
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    n = 1
    for d in dims:
        n *= d
    if len(body) != n:
        sys.exit(f"{path}: {len(body)} data bytes, the header gives {n}")
    return dims, body


def chunk(kind, payload):
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def gray_png(width, height, pixels):
    raw = b"".join(b"\0" + pixels[y * width:(y + 1) * width] for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 6))
            + chunk(b"IEND", b""))


def find(src, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(src, name)
        if os.path.exists(p):
            return p
    sys.exit(f"{src}: no {stem}[.gz] (install the dataset-fashion-mnist package or pass --src)")


def convert(src, out, split):
    (n, h, w), images = read_idx(find(src, f"{split}-images-idx3-ubyte"))
    (nl,), labels = read_idx(find(src, f"{split}-labels-idx1-ubyte"))
    if nl != n:
        sys.exit(f"{split}: {n} images but {nl} labels")
    root = os.path.join(out, split)
    for c in sorted(set(labels)):
        os.makedirs(os.path.join(root, str(c)), exist_ok=True)
    size = h * w
    for i in range(n):
        path = os.path.join(root, str(labels[i]), f"{i:05d}.png")
        with open(path, "wb") as f:
            f.write(gray_png(w, h, images[i * size:(i + 1) * size]))
    print(f"wrote {n} PNGs ({h}x{w} gray) to {root}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", default="datasets/fmnist_png")
    ap.add_argument("--split", default="both", choices=["train", "t10k", "both"])
    a = ap.parse_args()
    for split in (["train", "t10k"] if a.split == "both" else [a.split]):
        convert(a.src, a.out, split)


if __name__ == "__main__":
    main()
