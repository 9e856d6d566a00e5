#!/usr/bin/python3
"""PyTorch reference of a small GPT for test/test_gpt_ref.c (issue #13): 2 layers, 64 wide, 4 heads,
sequence 32, vocabulary 256 (~120k parameters), batch 2.

Run from the repo root with Debian's torch:  /usr/bin/python3 test/ref/gen_gpt_refs.py
Writes test/ref/gpt/gpt.json (the ctrain config) and test/ref/gpt/expect.json.

Storing the weights and every gradient would take about a megabyte, so nothing of that size is
stored. The initial weights and the token ids come from formula() below, which the C test computes
too, bit for bit: a 32-bit integer hash, a 16-bit integer divided by 2^15 (exact), times a power
of two (exact), and for layernorm weights 1 + that (exact: 19 significant bits). The outputs are
stored as summaries (summary()): for a tensor g, its L2 norm, its dot product with a +-1 vector
drawn from the hash, and 16 elements at hashed positions, all in double with 9 digits.

The reference runs in float64 on the same (exactly representable) weights and tokens, so the C
test's fp32 error is its own and not PyTorch's rounding. Stored:
  loss, logits and the gradient of every parameter of a forward/backward on samples 0 and 1;
  the losses of 5 AdamW steps (batch 2 each, samples 2k and 2k+1: shuffle off) and, after the
  fifth, the summary of each parameter's update (final - initial weights; update() below).
AdamW as ctrain's (DeepSpeed's FusedAdam in adam_w_mode, = torch.optim.AdamW): lr 1e-3, betas
0.9/0.95, eps 1e-8, no schedule; weight decay 0.1 on the 2-D tensors only (embeddings, position
table, linear weights: ctrain's weight_decay flags, docs/model.md), not on layernorm parameters or
biases; gradient clipping at global norm 1.0 as configs/gpt2_124m.json trains (torch's
clip_grad_norm_ = DeepSpeed's coefficient 1 / (norm + 1e-6) when the norm is above 1).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

from gen_layer_refs import gpt_logits, gpt_model

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt")
B, T, C, H, V, L, STEPS = 2, 32, 64, 4, 256, 2, 5
N_SAMPLED = 16
# Hash tags: tensor i of the parameters uses tag i; these are the others.
TAG_TOKENS, TAG_SIGN, TAG_LOGITS, TAG_POS = 1000, 2000, 3000, 4000
M32 = 0xFFFFFFFF


def mix(tag, i):
    """32-bit hash of (tag, index): a multiplicative key, then the 'lowbias32' finaliser."""
    x = (tag * 0x9E3779B1 + i + 0x165667B1) & M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


def unit(tag, n):
    """n values in [-1, 1): the hash's top 16 bits, centred, / 2^15 (exact in float32)."""
    return torch.tensor([((mix(tag, i) >> 16) - 32768) / 32768.0 for i in range(n)], dtype=torch.float64)


def param_specs():
    """(name, shape, kind) in ctrain's view order (layer order; weight before bias)."""
    specs = [("wte.weight", (V, C), "emb"), ("wpe.weight", (T, C), "emb")]
    for i in range(L):
        for name, o, n_in in (("ln1", C, 0), ("qkv", 3 * C, C), ("proj", C, C), ("ln2", C, 0),
                              ("fc1", 4 * C, C), ("fc2", C, 4 * C)):
            if n_in == 0:
                specs += [("%s.%d.weight" % (name, i), (o,), "ln_w"), ("%s.%d.bias" % (name, i), (o,), "ln_b")]
            else:
                specs += [("%s.%d.weight" % (name, i), (o, n_in), "w%d" % n_in),
                          ("%s.%d.bias" % (name, i), (o,), "bias")]
    return specs + [("ln_f.weight", (C,), "ln_w"), ("ln_f.bias", (C,), "ln_b")]


# Scales, all powers of two (exact): embeddings U(-1/32, 1/32) (std 0.018, GPT-2's 0.02), linear
# weights U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (fan_in 64 or 256), biases U(-1/32, 1/32) and
# layernorm biases U(-1/16, 1/16) (non-zero so their gradients' paths count), layernorm weights
# 1 + U(-1/8, 1/8).
SCALE = {"emb": 2.0 ** -5, "w64": 2.0 ** -3, "w256": 2.0 ** -4, "bias": 2.0 ** -5, "ln_b": 2.0 ** -4,
         "ln_w": 2.0 ** -3}


def formula(index, shape, kind):
    x = unit(index, math.prod(shape)) * SCALE[kind]
    return (1.0 + x if kind == "ln_w" else x).reshape(shape)


def tokens(n):
    return torch.tensor([mix(TAG_TOKENS, i) % V for i in range(n)])


def summary(g, tag):
    """Norm, dot with the +-1 vector, and N_SAMPLED elements at hashed positions, of tensor g."""
    g = g.detach().to(torch.float64).flatten()
    n = g.numel()
    sign = torch.tensor([-1.0 if mix(TAG_SIGN, i) >> 31 else 1.0 for i in range(n)], dtype=torch.float64)
    at = [mix(TAG_POS + tag, j) % n for j in range(N_SAMPLED)]
    return {"norm": short(g.norm().item()), "dot": short(torch.dot(sign, g).item()),
            "at": [short(g[k].item()) for k in at]}


def update(name, d):
    """The update d of parameter `name` as summarised: the key third of a qkv bias, whose gradient
    is exactly 0 (a constant added to every score of a row cancels in the softmax), is left out
    (set to 0): Adam's step there is rounding noise divided by itself plus eps, which depends on
    the precision (float64 here, fp32 in ctrain), not on the code."""
    if name.startswith("qkv.") and d.dim() == 1:
        d = d.clone()
        d[C:2 * C] = 0
    return d


def short(x):
    return float("%.9g" % x)


def main():
    os.makedirs(OUT, exist_ok=True)
    specs = param_specs()
    P = {name: formula(i, shape, kind).requires_grad_(True) for i, (name, shape, kind) in enumerate(specs)}
    init = {name: t.detach().clone() for name, t in P.items()}
    ids = tokens(B * STEPS * T + 1)

    def batch(k):
        """Samples 2k, 2k+1: windows of T + 1 tokens at sample * T (docs/formats.md, tokens)."""
        w = torch.stack([ids[s * T:s * T + T + 1] for s in (B * k, B * k + 1)])
        return w[:, :-1], w[:, 1:]

    def loss_of(x, y):
        logits = gpt_logits(P, x, H, L)
        return logits, F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))

    x, y = batch(0)
    logits, loss = loss_of(x, y)
    loss.backward()
    expect = {
        # Exact values for the test to check its formula against: hashes and weights.
        "formula": {"mix": [[t, i, mix(t, i)] for t, i in ((0, 0), (5, 77), (TAG_TOKENS, 3), (TAG_SIGN, 40000))],
                    "weights": [[i, k, float(formula(i, specs[i][1], specs[i][2]).flatten()[k])]
                                for i, k in ((0, 0), (0, 16383), (2, 5), (4, 1000), (8, 50), (10, 9000))],
                    "tokens": tokens(8).tolist()},
        "names": [s[0] for s in specs],
        "loss": short(loss.item()),
        "logits": summary(logits, TAG_LOGITS),
        "grads": {name: summary(P[name].grad, i) for i, name in enumerate(P)},
    }

    decay = [t for name, t in P.items() if t.dim() == 2]
    no_decay = [t for name, t in P.items() if t.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = loss_of(*batch(k))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(P.values(), 1.0)
        opt.step()
        losses.append(short(loss.item()))
    expect["losses"] = losses
    expect["update"] = {name: summary(update(name, P[name] - init[name]), i) for i, name in enumerate(P)}

    config = {
        "train_batch_size": B, "train_micro_batch_size_per_gpu": B,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        "model": gpt_model(T, C, H, V, L),
        "data": {"train": {"format": "tokens", "path": "tokens.bin", "seq_len": T}, "shuffle": False},
        "train": {"epochs": 1, "max_steps": STEPS, "seed": 7, "device": "cpu", "threads": 2},
    }
    with open(os.path.join(OUT, "gpt.json"), "w") as f:
        json.dump(config, f, indent=1)
    with open(os.path.join(OUT, "expect.json"), "w") as f:
        json.dump(expect, f, separators=(",", ":"))
    print("loss %.6f, step losses %s; wrote %s" % (expect["loss"], losses, OUT))


if __name__ == "__main__":
    main()
