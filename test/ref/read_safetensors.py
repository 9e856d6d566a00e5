#!/usr/bin/python3
"""read_safetensors.py: an independent safetensors reader (standard library + numpy), written
from the format description, not from ctrain's code, to check files ctrain writes.

  read_safetensors.py FILE...              list tensors (validates each file)
  read_safetensors.py --check DIR EXPECTED.json
        EXPECTED.json: {file relative to DIR: {tensor: {"dtype", "shape", "values"}}}; every
        file must hold exactly these tensors with these values (bit-exact after widening to
        float64). With Debian's python3-torch importable, each tensor is also decoded with
        torch.frombuffer and compared. Exit 0 when all match, 1 otherwise.
"""
import json
import struct
import sys

import numpy as np

MAX_HEADER = 100_000_000
NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
             "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}


class FormatError(Exception):
    pass


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise FormatError(f"duplicate key {k!r}")
        seen[k] = v
    return seen


def read(path):
    """Return (metadata dict, {name: numpy array}); raise FormatError on any violation."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER or 8 + n > len(blob):
        raise FormatError(f"header length {n} out of bounds")
    raw = blob[8:8 + n]
    if not raw.startswith(b"{"):
        raise FormatError("header does not start with '{'")
    header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FormatError("__metadata__ must map strings to strings")
    buf = blob[8 + n:]
    spans, out = [], {}
    for name, info in header.items():
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SIZES:
            raise FormatError(f"{name}: dtype {dtype} not handled by this reader")
        count = 1
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise FormatError(f"{name}: bad shape {shape}")
            count *= d
        if not (0 <= begin <= end <= len(buf)) or end - begin != count * SIZES[dtype]:
            raise FormatError(f"{name}: data_offsets {begin},{end} do not fit {dtype}{shape}")
        spans.append((begin, end, name))
        data = buf[begin:end]
        if dtype == "BF16":  # numpy has no bfloat16: widen the 16 bits to the top of a float32
            arr = (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view("<f4")
        else:
            arr = np.frombuffer(data, NP_DTYPES[dtype])
        out[name] = (dtype, arr.reshape(shape), data)
    pos = 0
    for begin, end, name in sorted(spans):
        if begin != pos:
            raise FormatError(f"{name}: gap or overlap at byte {begin} (expected {pos})")
        pos = end
    if pos != len(buf):
        raise FormatError(f"{len(buf) - pos} bytes after the last tensor")
    return meta, out


def torch_values(dtype, shape, data):
    """Decode with torch.frombuffer, or None when torch is absent or lacks the dtype."""
    try:
        import torch
    except ImportError:
        return None
    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "F64": torch.float64}.get(dtype)
    if tdt is None or len(data) == 0:
        return None
    t = torch.frombuffer(bytearray(data), dtype=tdt).reshape(shape)
    return (t.float() if dtype in ("F16", "BF16") else t).double().numpy()


def check(base, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    bad, compared, torch_compared = 0, 0, 0
    for rel, tensors in expected.items():
        try:
            _, got = read(f"{base}/{rel}")
        except (FormatError, ValueError, KeyError, OSError) as e:
            print(f"FAIL {rel}: {e}")
            bad += 1
            continue
        if set(got) != set(tensors):
            print(f"FAIL {rel}: tensors {sorted(got)} != expected {sorted(tensors)}")
            bad += 1
        for name, want in tensors.items():
            if name not in got:
                continue
            dtype, arr, data = got[name]
            exp = np.array(want["values"], dtype=np.float64).reshape(want["shape"])
            ok = dtype == want["dtype"] and list(arr.shape) == want["shape"]
            ok = ok and np.array_equal(arr.astype(np.float64), exp, equal_nan=True)
            tv = torch_values(dtype, want["shape"], data)
            if tv is not None:
                torch_compared += 1
                ok = ok and np.array_equal(tv, exp, equal_nan=True)
            compared += 1
            if not ok:
                print(f"FAIL {rel}: {name}: {dtype}{list(arr.shape)} {arr.ravel()[:4]} != "
                      f"{want['dtype']}{want['shape']} {exp.ravel()[:4]}")
                bad += 1
    print(f"read_safetensors: {compared} tensors compared ({torch_compared} also with torch), "
          f"{bad} mismatches")
    return 1 if bad else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--check":
        return check(argv[2], argv[3])
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    rc = 0
    for path in argv[1:]:
        try:
            meta, tensors = read(path)
        except (FormatError, ValueError, KeyError, OSError) as e:
            print(f"{path}: invalid: {e}")
            rc = 1
            continue
        print(f"{path}: {len(tensors)} tensors, metadata {meta}")
        for name, (dtype, arr, _) in sorted(tensors.items()):
            print(f"  {name:30s} {dtype:5s} {list(arr.shape)}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
