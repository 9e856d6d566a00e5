#!/usr/bin/python3
"""A small GPT-2 in Hugging Face's naming and layout, for test/e2e_hf_gpt2.sh (issue #13: fine-tuning
from GPT-2 weights). Same model as test/ref/gen_gpt_refs.py: 2 layers, 64 wide, 4 heads, sequence 32,
vocabulary 256.

  gen_hf_gpt2.py                 (Debian's torch) write test/ref/hf_gpt2/: eval.bin (4 token
                                 sequences, ctrain's token file), gpt.json (the ctrain config) and
                                 expect.json (PyTorch's eval loss of the weights on eval.bin)
  gen_hf_gpt2.py --weights FILE [--prefix transformer.] [--lm-head] [--drop NAME] [--extra NAME]
                 [--reshape NAME]
                                 (standard library only) write the weights as GPT-2's
                                 model.safetensors: HF names (h.0.attn.c_attn.weight, ...), Conv1D
                                 weights [in, out], the attn.bias mask buffers HF files carry;
                                 optionally every name prefixed (GPT2LMHeadModel's save_pretrained
                                 writes "transformer."), lm_head.weight (a copy of wte), or a
                                 tensor left out, added or given another shape (the error cases).

The weights are not committed (about 480 KB): they come from random.Random(SEED), whose sequence
Python guarantees for an integer seed, as multiples of 2^-15 times powers of two, so they are exact
in float32 and the e2e test rebuilds them bit for bit without torch. The reference loss is computed
in float64 on those exact weights, so ctrain's fp32 error is its own.
"""
import json
import math
import os
import random
import struct
import sys
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_gpt2")
T, C, H, V, L = 32, 64, 4, 256, 2
N_EVAL = 4                # eval sequences of T + 1 tokens (windows overlap by one token)
SEED = 1913
# The ctrain model's vocabulary: padded to 320 > 256 (as gpt2_124m's 50304 > 50257), with
# loss.classes 256, so the test loads through the padding.
V_PADDED = 320


def hf_specs():
    """(HF name, shape as HF stores it, scale, offset) in GPT-2's order. Conv1D weights are
    [in, out]. Scales are powers of two: embeddings +-1/32 (GPT-2's std 0.02), weights
    +-1/sqrt(fan_in), biases +-1/32, layernorm weights 1 +- 1/8 and biases +-1/16."""
    specs = [("wte.weight", (V, C), 2.0 ** -5, 0.0), ("wpe.weight", (T, C), 2.0 ** -5, 0.0)]
    for i in range(L):
        p = "h.%d." % i
        specs += [(p + "ln_1.weight", (C,), 2.0 ** -3, 1.0), (p + "ln_1.bias", (C,), 2.0 ** -4, 0.0),
                  (p + "attn.c_attn.weight", (C, 3 * C), 2.0 ** -3, 0.0),
                  (p + "attn.c_attn.bias", (3 * C,), 2.0 ** -5, 0.0),
                  (p + "attn.c_proj.weight", (C, C), 2.0 ** -3, 0.0),
                  (p + "attn.c_proj.bias", (C,), 2.0 ** -5, 0.0),
                  (p + "ln_2.weight", (C,), 2.0 ** -3, 1.0), (p + "ln_2.bias", (C,), 2.0 ** -4, 0.0),
                  (p + "mlp.c_fc.weight", (C, 4 * C), 2.0 ** -3, 0.0),
                  (p + "mlp.c_fc.bias", (4 * C,), 2.0 ** -5, 0.0),
                  (p + "mlp.c_proj.weight", (4 * C, C), 2.0 ** -4, 0.0),
                  (p + "mlp.c_proj.bias", (C,), 2.0 ** -5, 0.0)]
    return specs + [("ln_f.weight", (C,), 2.0 ** -3, 1.0), ("ln_f.bias", (C,), 2.0 ** -4, 0.0)]


def weights():
    """{HF name: (shape, flat list of floats)}, each value offset + k / 2^15 * scale (exact)."""
    rng = random.Random(SEED)
    out = {}
    for name, shape, scale, offset in hf_specs():
        n = math.prod(shape)
        out[name] = (shape, [offset + (rng.randrange(65536) - 32768) / 32768.0 * scale for _ in range(n)])
    return out


def eval_tokens():
    rng = random.Random(SEED + 1)
    return [rng.randrange(V) for _ in range(N_EVAL * T + 1)]


def write_safetensors(path, tensors):
    """tensors: {name: (dtype "F32" or "BOOL", shape, raw little-endian bytes)}. The format by hand:
    u64 header length, the JSON header (padded with spaces to a multiple of 8), the data."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def write_weights(argv):
    opts = {"--weights": None, "--prefix": "", "--drop": None, "--extra": None, "--reshape": None}
    lm_head, i = False, 0
    while i < len(argv):
        if argv[i] == "--lm-head":
            lm_head, i = True, i + 1
        elif argv[i] in opts and i + 1 < len(argv):
            opts[argv[i]], i = argv[i + 1], i + 2
        else:
            sys.exit("gen_hf_gpt2.py: unexpected argument %r (see the docstring)" % argv[i])
    w = weights()
    tensors = {name: ("F32", shape, f32(v)) for name, (shape, v) in w.items()}
    mask = [1.0 if k <= q else 0.0 for q in range(T) for k in range(T)]
    for b in range(L):   # the causal masks HF's GPT2Attention registers as buffers
        tensors["h.%d.attn.bias" % b] = ("F32", (1, 1, T, T), f32(mask))
        tensors["h.%d.attn.masked_bias" % b] = ("F32", (), f32([-1e4]))
    if lm_head:
        tensors["lm_head.weight"] = tensors["wte.weight"]
    if opts["--drop"]:
        del tensors[opts["--drop"]]
    if opts["--extra"]:
        tensors[opts["--extra"]] = ("F32", (C,), f32([0.5] * C))
    if opts["--reshape"]:   # one more row (or element) than GPT-2 holds
        dtype, shape, raw = tensors[opts["--reshape"]]
        rows = (shape[0] + 1,) + tuple(shape[1:])
        tensors[opts["--reshape"]] = (dtype, rows, raw + bytes(len(raw) // shape[0]))
    pre = opts["--prefix"]
    write_safetensors(opts["--weights"], {(n if n.startswith("lm_head") else pre + n): t
                                          for n, t in tensors.items()})


def ctrain_config():
    block = {"type": "transformer_block", "heads": H}
    return {
        "train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
        # lr 0: a one-step run evaluates and saves the weights exactly as loaded (the test's way
        # to turn an init_from into a checkpoint that `ctrain export` reads)
        "optimizer": {"type": "AdamW", "params": {"lr": 0.0, "weight_decay": 0.1}},
        "model": {"input": [T], "init_from": "model.safetensors", "layers": [
            {"type": "embedding", "name": "wte", "vocab": V_PADDED, "dim": C},
            {"type": "position_embedding", "name": "wpe", "max_len": T},
            {"type": "repeat", "times": L, "layers": [block]},
            {"type": "layernorm", "name": "ln_f"},
            {"type": "linear", "name": "lm_head", "out": V_PADDED, "bias": False, "tie": "wte.weight"}],
            "loss": {"type": "cross_entropy", "classes": V}},
        "data": {"train": {"format": "tokens", "path": "eval.bin", "seq_len": T},
                 "eval": {"format": "tokens", "path": "eval.bin", "seq_len": T}, "shuffle": False},
        "train": {"epochs": 1, "max_steps": 1, "seed": 7, "device": "cpu", "threads": 2},
    }


def reference_loss(ids):
    """GPT-2's forward as transformers' GPT2LMHeadModel computes it (Conv1D: x @ W + b with W
    [in, out]; gelu_new; layer_norm_epsilon 1e-5; the head tied to wte), in float64."""
    import torch
    import torch.nn.functional as F
    P = {n: torch.tensor(v, dtype=torch.float64).reshape(s) for n, (s, v) in weights().items()}

    def conv1d(x, name):
        return torch.addmm(P[name + ".bias"], x.reshape(-1, x.shape[-1]), P[name + ".weight"]).reshape(
            *x.shape[:-1], -1)

    def ln(x, name):
        return F.layer_norm(x, (C,), P[name + ".weight"], P[name + ".bias"], eps=1e-5)

    x_ids, y = ids[:, :-1], ids[:, 1:]
    B = x_ids.shape[0]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    x = P["wte.weight"][x_ids] + P["wpe.weight"][:T]
    for i in range(L):
        p = "h.%d." % i
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (z.view(B, T, H, C // H).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2) / math.sqrt(C // H)).masked_fill(mask, float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(a, p + "attn.c_proj")
        x = x + conv1d(F.gelu(conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    logits = ln(x, "ln_f") @ P["wte.weight"].t()
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()


def write_refs():
    import torch
    os.makedirs(OUT, exist_ok=True)
    toks = eval_tokens()
    head = b"CTTOKENS" + struct.pack("<IIQI", 1, 2, len(toks), V)
    with open(os.path.join(OUT, "eval.bin"), "wb") as f:
        f.write(head + struct.pack("<I", zlib.crc32(head)) + struct.pack("<%dH" % len(toks), *toks))
    # sample s is the window of T + 1 tokens at s * T (docs/formats.md, tokens)
    ids = torch.tensor([toks[s * T:s * T + T + 1] for s in range(N_EVAL)])
    loss = reference_loss(ids)
    with open(os.path.join(OUT, "gpt.json"), "w") as f:
        json.dump(ctrain_config(), f, indent=1)
    with open(os.path.join(OUT, "expect.json"), "w") as f:
        json.dump({"eval_loss": float("%.12g" % loss), "tokens": N_EVAL * T + 1, "seed": SEED}, f, indent=1)
    print("eval loss %.9f (PyTorch, float64); wrote %s" % (loss, OUT))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        write_weights(sys.argv[1:])
    else:
        write_refs()
