#!/usr/bin/python3
"""make_hdf5.py: HDF5 files written by h5py (Debian's python3-h5py) for the HDF5 reader's tests.
Exits 77 (the tests' "skipped") when h5py is missing.

    make_hdf5.py OUT_DIR small    OUT_DIR/layouts.h5: the same random samples (seed 19) in every
                                  layout and type the reader takes, and what it must refuse:
        u8_contig [20, 5, 6] uint8, contiguous        u8_chunked   the same, chunks [3, 5, 6]
        u8_gzip   the same, chunks [4, 5, 6], gzip 4  u8_compact   the same, compact layout
        f32_contig [20, 2, 3, 4] float32, contiguous  f32_gzip     the same, chunked, shuffle + gzip
        f64_flat  [20, 7] float64, chunks [7, 7]      u8_be16      [20, 5, 6] big-endian int16
        labels    [20] int64 (0..4)                   labels_u8    the same as uint8
        targets   [20, 2] float32                     labels_2d    [20, 2] int64 (refused)
        labels_short [19] int64 (refused)             labels_neg   [20] int64 with -1 at sample 3
        vector    [20] uint8 (refused: no sample dimensions)
        unwritten [100000, 64, 64] uint8 in chunks never written (refused: 400 MB declared, 0 stored)
        group/x   the u8 samples inside a group
        u8_fletcher  the u8 samples, chunks [4, 5, 6], shuffle + gzip + fletcher32
        u8_tiled  the u8 samples, chunks [3, 2, 4] (edge chunks along every dimension), gzip
        u8_fill   [20, 5, 6] uint8, chunks [4, 5, 6], fill value 7, only samples 0..11 written
        u8_lzf    the u8 samples with h5py's LZF filter (refused: a filter ctrain does not decode)
        f64_be    the float64 samples big-endian, chunks [6, 7], shuffle + gzip
        labels_be16 the labels as big-endian int16   labels_u32  the labels as uint32
    OUT_DIR/userblock.h5 and userblock_v3.h5: u8_contig, u8_gzip and labels after a 512-byte user
    block (h5py's userblock_size=512), superblock version 0 and 3 (libver "earliest", "latest");
    and OUT_DIR/expect.bin: the u8 samples (20 x 30 bytes), the float32 samples (20 x 24 floats,
    little-endian), the float64 samples (20 x 7 doubles), the labels (20 int64), the targets
    (20 x 2 float32), in that order.

    make_hdf5.py OUT_DIR seeds    the fuzz target's seeds (test/fuzz/fuzz_hdf5.c; each under 8 KiB):
                                  contiguous.h5, chunked.h5, gzip.h5 (uint8 "images" [6, 4, 4],
                                  int64 "labels"), float.h5 (float32 "images" [6, 3], chunked,
                                  shuffle + gzip, float32 "labels" [6, 2]), group.h5 ("images"
                                  in a group, as a link the reader follows)

    make_hdf5.py --idx IMAGES LABELS OUT.h5 LAYOUT [--count N]
                                  IDX images (gz, [N, 28, 28] uint8) and labels as datasets
                                  "images" and "labels" (int64) of OUT.h5, in IDX order; LAYOUT:
                                  contiguous, chunked (chunks of 64 samples) or gzip (the same,
                                  gzip level 4 with the shuffle filter)
"""
import gzip
import os
import struct
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"make_hdf5.py: {e} (apt-get install python3-h5py)")
    sys.exit(77)


def small(out):
    rng = np.random.default_rng(19)
    n = 20
    u8 = rng.integers(1, 256, size=(n, 5, 6), dtype=np.uint8)
    f32 = rng.standard_normal((n, 2, 3, 4)).astype(np.float32)
    f64 = rng.standard_normal((n, 7))
    labels = rng.integers(0, 4, size=n).astype(np.int64)
    labels[7] = 4  # the one largest label: the tests look for sample 7 in the label note
    targets = rng.standard_normal((n, 2)).astype(np.float32)
    with h5py.File(os.path.join(out, "layouts.h5"), "w") as f:
        f.create_dataset("u8_contig", data=u8)
        f.create_dataset("u8_chunked", data=u8, chunks=(3, 5, 6))
        f.create_dataset("u8_gzip", data=u8, chunks=(4, 5, 6), compression="gzip", compression_opts=4)
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        space = h5py.h5s.create_simple(u8.shape)
        h5py.h5d.create(f.id, b"u8_compact", h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, u8)
        f.create_dataset("f32_contig", data=f32)
        f.create_dataset("f32_gzip", data=f32, chunks=(5, 2, 3, 4), shuffle=True, compression="gzip")
        f.create_dataset("f64_flat", data=f64, chunks=(7, 7))
        f.create_dataset("u8_be16", data=u8.astype(">i2"))
        f.create_dataset("labels", data=labels)
        f.create_dataset("labels_u8", data=labels.astype(np.uint8))
        f.create_dataset("targets", data=targets)
        f.create_dataset("labels_2d", data=np.stack([labels, labels], axis=1))
        f.create_dataset("labels_short", data=labels[:19])
        neg = labels.copy()
        neg[3] = -1
        f.create_dataset("labels_neg", data=neg)
        f.create_dataset("vector", data=u8[:, 0, 0])
        f.create_dataset("unwritten", shape=(100000, 64, 64), dtype=np.uint8, chunks=(1, 64, 64))
        f.create_group("group").create_dataset("x", data=u8)
        f.create_dataset("u8_fletcher", data=u8, chunks=(4, 5, 6), shuffle=True, compression="gzip", fletcher32=True)
        f.create_dataset("u8_tiled", data=u8, chunks=(3, 2, 4), compression="gzip")
        fill = f.create_dataset("u8_fill", shape=u8.shape, dtype=np.uint8, chunks=(4, 5, 6), fillvalue=7)
        fill[:12] = u8[:12]
        f.create_dataset("u8_lzf", data=u8, chunks=(4, 5, 6), compression="lzf")
        f.create_dataset("f64_be", data=f64.astype(">f8"), chunks=(6, 7), shuffle=True, compression="gzip")
        f.create_dataset("labels_be16", data=labels.astype(">i2"))
        f.create_dataset("labels_u32", data=labels.astype("<u4"))
    # the same samples after a 512-byte user block, with the oldest superblock (version 0) and the newest
    for name, libver in (("userblock.h5", "earliest"), ("userblock_v3.h5", "latest")):
        with h5py.File(os.path.join(out, name), "w", userblock_size=512, libver=libver) as f:
            f.create_dataset("u8_contig", data=u8)
            f.create_dataset("u8_gzip", data=u8, chunks=(4, 5, 6), compression="gzip", compression_opts=4)
            f.create_dataset("labels", data=labels)
    with open(os.path.join(out, "expect.bin"), "wb") as e:
        for a in (u8, f32.astype("<f4"), f64.astype("<f8"), labels.astype("<i8"), targets.astype("<f4")):
            e.write(a.tobytes())


def seeds(out):
    rng = np.random.default_rng(7)
    x = rng.integers(1, 256, size=(6, 4, 4), dtype=np.uint8)
    y = rng.integers(0, 3, size=6).astype(np.int64)
    for name, opts in (("contiguous", {}), ("chunked", {"chunks": (2, 4, 4)}),
                       ("gzip", {"chunks": (3, 4, 4), "compression": "gzip"})):
        with h5py.File(os.path.join(out, name + ".h5"), "w") as f:
            f.create_dataset("images", data=x, **opts)
            f.create_dataset("labels", data=y)
    with h5py.File(os.path.join(out, "float.h5"), "w") as f:
        f.create_dataset("images", data=rng.standard_normal((6, 3)).astype(np.float32), chunks=(2, 3),
                         shuffle=True, compression="gzip")
        f.create_dataset("labels", data=rng.standard_normal((6, 2)).astype(np.float32))
    with h5py.File(os.path.join(out, "group.h5"), "w") as f:
        f.create_group("g").create_dataset("x", data=x)
        f["images"] = f["g/x"]  # a hard link
        f.create_dataset("labels", data=y)


def idx_array(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def from_idx(images, labels, out, layout, count):
    x = idx_array(images)[:count]
    y = idx_array(labels)[:count].astype(np.int64)
    opts = {"contiguous": {}, "chunked": {"chunks": (64,) + x.shape[1:]},
            "gzip": {"chunks": (64,) + x.shape[1:], "compression": "gzip", "compression_opts": 4, "shuffle": True}}
    if layout not in opts:
        sys.exit(f"make_hdf5.py: layout {layout!r}: expected contiguous, chunked or gzip")
    with h5py.File(out, "w") as f:
        f.create_dataset("images", data=x, **opts[layout])
        f.create_dataset("labels", data=y)


def main(argv):
    if len(argv) == 3 and argv[2] == "small":
        small(argv[1])
    elif len(argv) == 3 and argv[2] == "seeds":
        seeds(argv[1])
    elif len(argv) >= 6 and argv[1] == "--idx":
        count = int(argv[argv.index("--count") + 1]) if "--count" in argv else None
        from_idx(argv[2], argv[3], argv[4], argv[5], count)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
