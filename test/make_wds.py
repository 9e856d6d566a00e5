#!/usr/bin/python3
"""make_wds.py: small WebDataset shards written by Python's tarfile, for test_datasets.c.

    make_wds.py OUT_DIR png      3 shards (pax, GNU and ustar tar formats) of PNG + .cls samples
    make_wds.py OUT_DIR npy      2 shards of float32 .npy [2, 3] + .txt samples
    make_wds.py OUT_DIR npy-f64  like npy, one sample stored as float64 (refused)
    make_wds.py OUT_DIR npy-forms  2 shards of float32 .npy [2, 3] in every header version (1, 2, 3):
                                 shard 0 GNU tar, shard 1 POSIX ustar whose member names need the
                                 prefix field (every name's last part is "s.npy" or "s.txt": the
                                 directory tells the samples apart); OUT_DIR/values.txt holds each
                                 sample's 6 values (%.9g, exact in float32)
    make_wds.py OUT_DIR npy-u8   1 shard of uint8 .npy [1, 4, 4] ('|u1' and '<u1' descr) + .cls
    make_wds.py OUT_DIR npy-refused  1 shard of float32 .npy [2, 3]: sample 2 big-endian ('>f4'),
                                 sample 3 in Fortran order (both refused), the others plain
    make_wds.py OUT_DIR nolabel  like png, one sample without its .cls member (its key holds an
                                 escape sequence, ESC [2J)
    make_wds.py OUT_DIR jpg      like png, with 8x8 RGB JPEG (.jpg) images written by Pillow

Writes OUT_DIR/manifest.txt: one line per sample, "SHARD KEY LABEL ID", where ID is what the
sample's input encodes (PNG: pixel 0 + 256 * pixel 1; npy: element 0; JPEG: 0). The jpg mode also
writes OUT_DIR/pixels.txt: per sample, Pillow's decode of its JPEG ([H, W, 3] bytes, in hex), which
ctrain's libjpeg-turbo decode must equal. Standard library only, but Pillow for jpg.
"""
import io
import random
import struct
import sys
import tarfile
import zlib


def png_gray(h, w, pixels):
    """An 8-bit grayscale PNG (filter 0 on every row)."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + bytes(pixels[y * w:(y + 1) * w]) for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def jpeg_rgb(rng, h, w):
    """A smooth random RGB image as a JPEG (quality 90), and Pillow's decode of it (Pillow is
    imported here: only the jpg modes need it)."""
    import io as _io
    from PIL import Image
    base = [rng.randrange(256) for _ in range(3)]
    px = bytes((base[c] + 9 * y + 5 * x + rng.randrange(12)) % 256 for y in range(h) for x in range(w) for c in range(3))
    out = _io.BytesIO()
    Image.frombytes("RGB", (w, h), px).save(out, format="JPEG", quality=90)
    data = out.getvalue()
    return data, Image.open(_io.BytesIO(data)).convert("RGB").tobytes()


def npy(values, shape, descr, version=1, fortran=False):
    """A .npy array as numpy writes it: magic, version, the header's length (2 bytes in version 1,
    4 in versions 2 and 3), the header padded with spaces and a newline to a multiple of 64 bytes,
    then the data."""
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False", "".join("%d, " % d for d in shape))
    start = 10 if version == 1 else 12
    header += " " * ((64 - (start + len(header) + 1) % 64) % 64) + "\n"
    fmt = {"<f4": "<%df", ">f4": ">%df", "<f8": "<%dd", "|u1": "%dB", "<u1": "%dB"}[descr] % len(values)
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + struct.pack(fmt, *values)


def f32(v):
    """v rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def npy_forms(out, mode):
    """The npy-forms, npy-u8 and npy-refused modes (see the docstring)."""
    rng = random.Random(23)
    lines, values = [], []
    if mode == "npy-forms":
        shards = [(tarfile.GNU_FORMAT, [1, 2, 3, 1]), (tarfile.USTAR_FORMAT, [2, 3, 1, 2])]
    else:
        shards = [(tarfile.PAX_FORMAT, [1, 1, 1, 1, 1])]
    sid = 0
    for s, (fmt, versions) in enumerate(shards):
        with tarfile.open("%s/shard-%06d.tar" % (out, s), "w", format=fmt) as tar:
            for j, version in enumerate(versions):
                sid += 1
                label = rng.randrange(5)
                key = "part.%d/sample%06d" % (s, sid)
                if fmt == tarfile.USTAR_FORMAT:
                    key = "deep/%d/" % sid + "d" * 100 + "/s"
                if mode == "npy-u8":
                    ident = 300 + 37 * sid
                    px = [ident % 256, ident // 256] + [rng.randrange(256) for _ in range(14)]
                    add(tar, key + ".npy", npy(px, (1, 4, 4), "|u1" if j % 2 == 0 else "<u1"))
                    add(tar, key + ".cls", b"%d" % label)
                else:
                    ident = 300 + 37 * sid
                    vals = [f32(float(ident))] + [f32(rng.uniform(-1000, 1000)) for _ in range(5)]
                    descr = ">f4" if mode == "npy-refused" and sid == 2 else "<f4"
                    add(tar, key + ".npy", npy(vals, (2, 3), descr, version, fortran=mode == "npy-refused" and sid == 3))
                    add(tar, key + ".txt", b"%d\n" % label)
                    values.append(" ".join("%.9g" % v for v in vals))
                lines.append("%d %s %d %d" % (s, key, label, ident))
    with open(out + "/manifest.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    if values:
        with open(out + "/values.txt", "w") as f:
            f.write("\n".join(values) + "\n")


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main():
    out, mode = sys.argv[1], sys.argv[2]
    if mode in ("npy-forms", "npy-u8", "npy-refused"):
        npy_forms(out, mode)
        return
    rng = random.Random(19)
    formats = [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]
    shards = 2 if mode.startswith("npy") else 3
    per_shard = [5, 4, 6]
    lines, sid, decoded = [], 0, []
    for s in range(shards):
        path = "%s/shard-%06d.tar" % (out, s)
        with tarfile.open(path, "w", format=formats[s]) as tar:
            for j in range(per_shard[s]):
                sid += 1
                ident = 300 + 37 * sid  # above 255: both bytes of the PNG id matter
                label = rng.randrange(5)
                key = "part.%d/sample%06d" % (s, sid)
                if mode == "nolabel" and sid == 4:  # the sample without a label: a key with an escape sequence
                    key = "part.%d/\x1b[2Jsample%06d" % (s, sid)
                if s < 2 and j == 1:  # a name longer than ustar holds: pax (shard 0), GNU (shard 1)
                    key = "long/" + "x" * 120 + "/s%d" % sid
                if mode.startswith("npy"):
                    vals = [float(ident)] + [rng.uniform(-1, 1) for _ in range(5)]
                    descr = "<f8" if mode == "npy-f64" and sid == 3 else "<f4"
                    add(tar, key + ".npy", npy(vals, (2, 3), descr))
                    add(tar, key + ".txt", b"%d\n" % label)
                elif mode == "jpg":
                    data, rgb = jpeg_rgb(rng, 8, 8)
                    add(tar, key + ".jpg", data)
                    add(tar, key + ".cls", b"%d" % label)
                    decoded.append(rgb.hex())
                    ident = 0
                else:
                    px = [ident % 256, ident // 256] + [rng.randrange(256) for _ in range(14)]
                    add(tar, key + ".png", png_gray(4, 4, px))
                    if not (mode == "nolabel" and sid == 4):
                        add(tar, key + ".cls", b"%d" % label)
                    add(tar, key + ".meta.json", b"{}")  # another field: ignored
                lines.append("%d %s %d %d" % (s, key, label, ident))
    with open(out + "/manifest.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    if decoded:
        with open(out + "/pixels.txt", "w") as f:
            f.write("\n".join(decoded) + "\n")


if __name__ == "__main__":
    main()
