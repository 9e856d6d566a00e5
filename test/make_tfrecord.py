#!/usr/bin/python3
"""make_tfrecord.py: TFRecord files of tf.Example records, written without TensorFlow: the framing
(length, masked CRC-32C of the length, data, masked CRC-32C of the data) and the Example protobuf
encoded here by hand, as TensorFlow's TFRecordWriter and Example.SerializeToString() write them.

    make_tfrecord.py OUT_DIR png      2 files of 4x4 gray PNG "image" + int64 "label" (+ "id", "name")
    make_tfrecord.py OUT_DIR raw      2 files of raw uint8 "image" bytes (shape [1, 4, 4]) + "label"
    make_tfrecord.py OUT_DIR float    2 files of float_list "x" [6] (packed in file 0, unpacked in 1)
                                      + int64 "y" (packed in file 0, unpacked in 1)
    make_tfrecord.py OUT_DIR index    like png, plus OUT_DIR/part-N.index (tfrecord2idx's format)
    make_tfrecord.py OUT_DIR jpg      like png, with 8x8 RGB JPEG images written by Pillow, and
                                      OUT_DIR/pixels.txt: Pillow's decode of each ([H, W, 3], hex)
    make_tfrecord.py OUT_DIR bad      like png, but file 0 record 2 has a float_list "label", file 1
                                      record 1 a 3x3 image and file 1 record 2 no "label" and a
                                      feature named "\x1b[31mred\n" (an escape sequence, a newline)
    make_tfrecord.py OUT_DIR values   every value range of every feature type, packed in file 0 and
                                      unpacked in file 1: int64_list "v" [6] (negatives as 10-byte
                                      varints, -2^63, 2^63 - 1, 2^53), float_list "f" [6] (NaN, +-inf,
                                      -0, a denormal, the largest float), int64 "y" (a class) and
                                      "y2" (like y but -1 in file 0 record 1 and 2^31 in file 1
                                      record 1), bytes "img" (a PNG, empty in file 1 record 2) and
                                      "raw" (16 bytes, empty in file 0 record 3); OUT_DIR/values.txt
                                      holds each record's v (decimal) then f (%.9g)
    make_tfrecord.py --idx IMAGES LABELS OUT_PATTERN FILES [png|raw] [--index] [--count N]
                                      IDX images (gz) and labels (the first N) as FILES TFRecord
                                      files OUT_PATTERN % k (k = 0..FILES-1), in IDX order; with
                                      --index, each file's index beside it (.index for .tfrecord)

The small modes write OUT_DIR/part-0.tfrecord, part-1.tfrecord and OUT_DIR/manifest.txt: one line
per record, "FILE RECORD LABEL ID", where ID is what the record's input encodes (PNG and raw: pixel
0 + 256 * pixel 1; float: element 0; JPEG: 0). Standard library only (and make_wds.py beside it),
but Pillow for jpg.
"""
import gzip
import random
import struct
import sys

sys.dont_write_bytecode = True  # no __pycache__ in test/ from the import below
from make_wds import jpeg_rgb, png_gray  # noqa: E402  (the same PNGs and JPEGs as the WebDataset tests)


def _crc32c_table():
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """One TFRecord record."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


# ---- protobuf encoding ----

def varint(v):
    v &= (1 << 64) - 1  # int64: negative numbers as 10-byte two's complement
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def length_delimited(field, payload):
    return key(field, 2) + varint(len(payload)) + payload


def bytes_list(values):
    return length_delimited(1, b"".join(length_delimited(1, v) for v in values))


def float_list(values, packed=True):
    if packed:
        body = length_delimited(1, struct.pack("<%df" % len(values), *values))
    else:
        body = b"".join(key(1, 5) + struct.pack("<f", v) for v in values)
    return length_delimited(2, body)


def int64_list(values, packed=True):
    if packed:
        body = length_delimited(1, b"".join(varint(v) for v in values))
    else:
        body = b"".join(key(1, 0) + varint(v) for v in values)
    return length_delimited(3, body)


def example(features):
    """features: [(name, Feature bytes)] in order -> a serialized tf.Example."""
    entries = b"".join(length_delimited(1, length_delimited(1, name.encode()) + length_delimited(2, feat))
                       for name, feat in features)
    return length_delimited(1, entries)


def write_file(path, records, index_path=None):
    offsets = []
    with open(path, "wb") as f:
        for data in records:
            rec = frame(data)
            offsets.append((f.tell(), len(rec)))
            f.write(rec)
    if index_path:
        with open(index_path, "w") as f:
            f.write("".join("%d %d\n" % o for o in offsets))


def small(out, mode):
    rng = random.Random(19)
    per_file = [5, 4]
    lines, sid, decoded = [], 0, []
    for k, n in enumerate(per_file):
        records = []
        for r in range(n):
            sid += 1
            ident = 300 + 37 * sid  # above 255: both bytes of the id matter
            label = rng.randrange(5)
            if mode == "float":
                vals = [float(ident)] + [rng.uniform(-1, 1) for _ in range(5)]
                feats = [("y", int64_list([label], packed=k == 0)), ("x", float_list(vals, packed=k == 0))]
            else:
                px = [ident % 256, ident // 256] + [rng.randrange(256) for _ in range(14)]
                img = bytes(px) if mode == "raw" else png_gray(4, 4, px)
                if mode == "jpg":
                    img, rgb = jpeg_rgb(rng, 8, 8)
                    decoded.append(rgb.hex())
                    ident = 0
                lab = int64_list([label])
                if mode == "bad" and (k, r) == (0, 2):
                    lab = float_list([float(label)])
                if mode == "bad" and (k, r) == (1, 1):
                    img = png_gray(3, 3, px[:9])
                feats = [("id", int64_list([ident])), ("image", bytes_list([img])), ("label", lab),
                         ("name", bytes_list([b"sample%d" % sid]))]
                if mode == "bad" and (k, r) == (1, 2):  # no label; a feature name with control bytes
                    del feats[2]
                    feats.append(("\x1b[31mred\n", int64_list([1])))
            records.append(example(feats))
            lines.append("%d %d %d %d" % (k, r, label, ident))
        write_file("%s/part-%d.tfrecord" % (out, k), records,
                   "%s/part-%d.index" % (out, k) if mode == "index" else None)
    with open(out + "/manifest.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    if decoded:
        with open(out + "/pixels.txt", "w") as f:
            f.write("\n".join(decoded) + "\n")


def values(out):
    """The values mode (see the docstring)."""
    rng = random.Random(29)
    lines, vals, sid = [], [], 0
    for k, n in enumerate([4, 4]):
        records = []
        for r in range(n):
            sid += 1
            ident = 300 + 37 * sid
            label = rng.randrange(5)
            v = [ident, -1, -(1 << 40) - sid, 1 << 53, -(1 << 63), (1 << 63) - 1]
            f = [float(ident), float("nan"), float("inf"), float("-inf"), -0.0,
                 [1e-40, 3.4028234663852886e38, -2.5e-3, 1.5][r]]
            y2 = -1 if (k, r) == (0, 1) else (1 << 31) if (k, r) == (1, 1) else label
            px = [ident % 256, ident // 256] + [rng.randrange(256) for _ in range(14)]
            img = b"" if (k, r) == (1, 2) else png_gray(4, 4, px)
            raw = b"" if (k, r) == (0, 3) else bytes(px)
            packed = k == 0
            records.append(example([("v", int64_list(v, packed)), ("f", float_list(f, packed)),
                                    ("y", int64_list([label], packed)), ("y2", int64_list([y2], packed)),
                                    ("img", bytes_list([img])), ("raw", bytes_list([raw]))]))
            lines.append("%d %d %d %d" % (k, r, label, ident))
            vals.append(" ".join(["%d" % x for x in v] + ["%.9g" % struct.unpack("<f", struct.pack("<f", x))[0]
                                                          for x in f]))
        write_file("%s/part-%d.tfrecord" % (out, k), records)
    with open(out + "/manifest.txt", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(out + "/values.txt", "w") as fh:
        fh.write("\n".join(vals) + "\n")


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">%dI" % ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def from_idx(images, labels, pattern, files, encoding, index, count):
    (n, h, w), pixels = read_idx(images)
    (nl,), ys = read_idx(labels)
    assert n == nl, "images and labels differ in count"
    n = min(n, count) if count else n
    per = (n + files - 1) // files
    for k in range(files):
        records = []
        for i in range(k * per, min(n, (k + 1) * per)):
            px = pixels[i * h * w:(i + 1) * h * w]
            img = png_gray(h, w, px) if encoding == "png" else px
            records.append(example([("image", bytes_list([img])), ("label", int64_list([ys[i]]))]))
        path = pattern % k
        write_file(path, records, path.rsplit(".", 1)[0] + ".index" if index else None)


def main():
    if sys.argv[1] == "--idx":
        args, count, index = [], 0, False
        rest = iter(sys.argv[2:])
        for a in rest:
            if a == "--index":
                index = True
            elif a == "--count":
                count = int(next(rest))
            else:
                args.append(a)
        from_idx(args[0], args[1], args[2], int(args[3]), args[4] if len(args) > 4 else "raw", index, count)
    elif sys.argv[2] == "values":
        values(sys.argv[1])
    else:
        small(sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
