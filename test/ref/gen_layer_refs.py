#!/usr/bin/python3
"""Write PyTorch reference values for every ctrain layer type and loss to test/ref/layers/*.bin.

Run from the repo root with Debian's torch:  /usr/bin/python3 test/ref/gen_layer_refs.py
test/test_layers.c reads the files (committed, so the tests need no PyTorch).

File format (little endian):
  "CTRF"  u32 version (1)  u32 json_len  json bytes (the case: layer config, batch, mode)
  u32 n_arrays, then per array: u32 name_len, name, u32 ndim, i32 dims[ndim], f32 data[prod(dims)]
Integer tensors (token ids, class labels) are stored as f32 (exact for small values).
Array names: x0, x1, ... inputs; p0, p1, ... parameters and buffers in the layer's spec order
(before forward); y output; dy upstream gradient; dx0, ... input gradients; dp0, ... parameter
gradients; r2, r3 batchnorm running statistics after the forward.
Losses: logits, target, loss (scalar, mean), dlogits (gradient of the mean loss)."""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers")
torch.manual_seed(1234)


def write(name, case, arrays):
    text = json.dumps(case, sort_keys=True).encode()
    with open(os.path.join(OUT, name + ".bin"), "wb") as f:
        f.write(b"CTRF" + struct.pack("<II", 1, len(text)) + text)
        f.write(struct.pack("<I", len(arrays)))
        for key, t in arrays:
            t = t.detach().to(torch.float32).contiguous()
            f.write(struct.pack("<I", len(key)) + key.encode())
            f.write(struct.pack("<I", t.dim()) + struct.pack("<%di" % t.dim(), *t.shape))
            f.write(t.numpy().tobytes())


def rand(*shape):
    # never zeros: uniform in [-1.5, 1.5] away from 0 so relu-like kinks are not hit
    t = torch.rand(*shape) * 1.5 + 0.05
    return t * torch.where(torch.rand(*shape) < 0.5, -1.0, 1.0)


def run_layer(name, layer, xs, fn, params, buffers=(), train=True, mode="train"):
    """fn(xs, params, buffers) -> y. Saves inputs, params, outputs and all gradients."""
    xs = [x.clone().requires_grad_(x.dtype == torch.float32) for x in xs]
    ps = [p.clone().requires_grad_(True) for p in params]
    bs = [b.clone() for b in buffers]
    arrays = [("x%d" % i, x) for i, x in enumerate(xs)]
    arrays += [("p%d" % i, p.detach().clone()) for i, p in enumerate(ps + bs)]
    y = fn(xs, ps, bs)
    dy = rand(*y.shape)
    y.backward(dy)
    arrays += [("y", y), ("dy", dy)]
    arrays += [("dx%d" % i, x.grad) for i, x in enumerate(xs) if x.grad is not None]
    arrays += [("dp%d" % i, p.grad) for i, p in enumerate(ps)]
    arrays += [("r%d" % (len(ps) + i), b) for i, b in enumerate(bs)]
    write(name, {"layer": layer, "mode": mode}, arrays)


def linear_cases():
    x = rand(3, 5)
    w, b = rand(4, 5) * 0.5, rand(4)
    run_layer("linear", {"type": "linear", "out": 4}, [x], lambda xs, p, _: F.linear(xs[0], p[0], p[1]), [w, b])
    x = rand(2, 3, 5)
    run_layer("linear_rank3_nobias", {"type": "linear", "out": 4, "bias": False}, [x],
              lambda xs, p, _: F.linear(xs[0], p[0]), [w])


def conv_cases():
    x = rand(2, 3, 6, 5)
    w, b = rand(4, 3, 3, 3) * 0.3, rand(4)
    run_layer("conv2d", {"type": "conv2d", "out": 4, "kernel": 3, "stride": 2, "padding": 1}, [x],
              lambda xs, p, _: F.conv2d(xs[0], p[0], p[1], stride=2, padding=1), [w, b])
    x = rand(2, 4, 7, 6)
    w, b = rand(6, 2, 3, 2) * 0.3, rand(6)
    cfg = {"type": "conv2d", "out": 6, "kernel": [3, 2], "stride": [1, 2], "padding": [1, 0],
           "dilation": 2, "groups": 2}
    run_layer("conv2d_groups", cfg, [x],
              lambda xs, p, _: F.conv2d(xs[0], p[0], p[1], stride=(1, 2), padding=(1, 0), dilation=2, groups=2),
              [w, b])


def pool_cases():
    x = rand(2, 3, 6, 6)
    run_layer("maxpool2d", {"type": "maxpool2d", "kernel": 3, "stride": 2, "padding": 1}, [x],
              lambda xs, p, _: F.max_pool2d(xs[0], 3, 2, 1), [])
    run_layer("avgpool2d", {"type": "avgpool2d", "kernel": 2, "stride": 1, "padding": 1}, [x],
              lambda xs, p, _: F.avg_pool2d(xs[0], 2, 1, 1), [])
    run_layer("avgpool2d_nopad", {"type": "avgpool2d", "kernel": [3, 2], "count_include_pad": False,
                                  "padding": 1}, [x],
              lambda xs, p, _: F.avg_pool2d(xs[0], (3, 2), (3, 2), 1, count_include_pad=False), [])
    run_layer("global_avgpool", {"type": "global_avgpool"}, [x],
              lambda xs, p, _: xs[0].mean(dim=(2, 3)), [])


def norm_cases():
    x = rand(4, 3, 3, 3) * 2 + 0.5
    g, b = rand(3), rand(3)
    rm, rv = rand(3) * 0.1, torch.rand(3) + 0.5
    run_layer("batchnorm2d", {"type": "batchnorm2d", "momentum": 0.2}, [x],
              lambda xs, p, bs: F.batch_norm(xs[0], bs[0], bs[1], p[0], p[1], True, 0.2, 1e-5),
              [g, b], [rm, rv])
    run_layer("batchnorm2d_eval", {"type": "batchnorm2d"}, [x],
              lambda xs, p, bs: F.batch_norm(xs[0], bs[0], bs[1], p[0], p[1], False, 0.1, 1e-5),
              [g, b], [rm, rv], mode="eval")
    x = rand(3, 4, 6)
    g, b = rand(6), rand(6)
    run_layer("layernorm", {"type": "layernorm", "eps": 1e-4}, [x],
              lambda xs, p, _: F.layer_norm(xs[0], (6,), p[0], p[1], 1e-4), [g, b])


def activation_cases():
    x = rand(3, 7) * 2
    acts = {
        "relu": ({"type": "relu"}, F.relu),
        "leaky_relu": ({"type": "leaky_relu", "negative_slope": 0.2}, lambda t: F.leaky_relu(t, 0.2)),
        "gelu": ({"type": "gelu"}, F.gelu),
        "gelu_tanh": ({"type": "gelu", "approximate": "tanh"}, lambda t: F.gelu(t, approximate="tanh")),
        "silu": ({"type": "silu"}, F.silu),
        "tanh": ({"type": "tanh"}, torch.tanh),
        "sigmoid": ({"type": "sigmoid"}, torch.sigmoid),
    }
    for name, (cfg, f) in acts.items():
        run_layer(name, cfg, [x], lambda xs, p, _, f=f: f(xs[0]), [])
    run_layer("dropout_eval", {"type": "dropout", "p": 0.3}, [x], lambda xs, p, _: F.dropout(xs[0], 0.3, False),
              [], mode="eval")


def shape_cases():
    x = rand(2, 3, 2, 2)
    run_layer("flatten", {"type": "flatten"}, [x], lambda xs, p, _: xs[0].flatten(1), [])
    run_layer("reshape", {"type": "reshape", "shape": [3, -1]}, [x], lambda xs, p, _: xs[0].reshape(2, 3, 4), [])
    a, b, c = rand(2, 5), rand(2, 5), rand(2, 5)
    run_layer("add", {"type": "add"}, [a, b, c], lambda xs, p, _: xs[0] + xs[1] + xs[2], [])
    a, b = rand(2, 3, 2, 2), rand(2, 1, 2, 2)
    run_layer("concat", {"type": "concat"}, [a, b], lambda xs, p, _: torch.cat(xs, 1), [])
    a, b = rand(2, 3, 2), rand(2, 3, 4)
    run_layer("concat_last", {"type": "concat", "axis": -1}, [a, b], lambda xs, p, _: torch.cat(xs, 2), [])
    ids = torch.tensor([[1, 3, 3, 6], [0, 2, 6, 1]])
    w = rand(7, 3)
    run_layer("embedding", {"type": "embedding", "vocab": 7, "dim": 3}, [ids],
              lambda xs, p, _: F.embedding(xs[0], p[0]), [w])


def loss_case(name, loss, logits, target, fn):
    logits = logits.clone().requires_grad_(True)
    value = fn(logits, target)
    value.backward()
    write(name, {"loss": loss}, [("logits", logits), ("target", target), ("loss", value.reshape(1)),
                                 ("dlogits", logits.grad)])


def loss_cases():
    logits, labels = rand(5, 4) * 2, torch.tensor([0, 3, 1, 1, 2])
    loss_case("cross_entropy", {"type": "cross_entropy"}, logits, labels, lambda l, t: F.cross_entropy(l, t))
    loss_case("cross_entropy_smooth", {"type": "cross_entropy", "label_smoothing": 0.1}, logits, labels,
              lambda l, t: F.cross_entropy(l, t, label_smoothing=0.1))
    pred, target = rand(3, 4), rand(3, 4)
    loss_case("mse", {"type": "mse"}, pred, target, F.mse_loss)
    loss_case("bce_with_logits", {"type": "bce_with_logits"}, pred * 2, torch.rand(3, 4),
              F.binary_cross_entropy_with_logits)


def tied_lm_case():
    """A whole small model with its LM head tied to the token embedding (test_graph.c): the
    gradient of the one shared tensor sums the embedding's scatter and the head's GEMM."""
    model = {"input": [5], "loss": {"type": "cross_entropy"}, "layers": [
        {"type": "embedding", "name": "wte", "vocab": 11, "dim": 6},
        {"type": "layernorm", "name": "ln"},
        {"type": "linear", "name": "head", "out": 11, "bias": False, "tie": "wte.weight"}]}
    ids = torch.tensor([[1, 4, 4, 9, 0], [10, 3, 7, 1, 1], [2, 2, 5, 8, 6]])
    target = torch.tensor([[4, 4, 9, 0, 3], [3, 7, 1, 1, 10], [2, 5, 8, 6, 0]])
    wte = rand(11, 6).requires_grad_(True)
    ln_w = (1.0 + 0.2 * rand(6)).requires_grad_(True)
    ln_b = (0.1 * rand(6)).requires_grad_(True)
    h = F.layer_norm(F.embedding(ids, wte), (6,), ln_w, ln_b)
    loss = F.cross_entropy(F.linear(h, wte).reshape(-1, 11), target.reshape(-1))
    loss.backward()
    write("tied_lm", {"model": model}, [("ids", ids), ("target", target), ("wte", wte), ("ln_w", ln_w),
                                         ("ln_b", ln_b), ("loss", loss.reshape(1)), ("d_wte", wte.grad),
                                         ("d_ln_w", ln_w.grad), ("d_ln_b", ln_b.grad)])


def position_embedding_case():
    """GPT-2's wpe: x + W[0:T] with max_len > T, so the rows past T must get no gradient."""
    x, w = rand(2, 4, 3), rand(6, 3)
    run_layer("position_embedding", {"type": "position_embedding", "max_len": 6}, [x],
              lambda xs, p, _: xs[0] + F.embedding(torch.arange(4), p[0]), [w])


def causal_self_attention_case():
    """GPT-2's attention core on a fused qkv [B, T, 3C]: q, k, v of H heads of D, a causal softmax
    of q k^T / sqrt(D), heads side by side; written with explicit T x T matrices."""
    B, T, H, D = 2, 5, 2, 3
    x = rand(B, T, 3 * H * D)

    def attend(xs, _p, _b):
        q, k, v = xs[0].view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # each [B, H, T, D]
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)

    run_layer("causal_self_attention", {"type": "causal_self_attention", "heads": H}, [x], attend, [])


def gpt_model(T, C, H, V, L):
    """ctrain's model section of a GPT-2-shaped model: token and position embeddings, L pre-norm
    blocks written once with block_input (causal attention over a fused qkv, GELU-tanh MLP,
    residuals), a final layernorm and the head tied to the token embedding."""
    blocks = [
        {"type": "layernorm", "name": "ln1"}, {"type": "linear", "name": "qkv", "out": 3 * C},
        {"type": "causal_self_attention", "name": "attn", "heads": H},
        {"type": "linear", "name": "proj", "out": C},
        {"type": "add", "name": "res1", "inputs": ["block_input", "proj"]},
        {"type": "layernorm", "name": "ln2"}, {"type": "linear", "name": "fc1", "out": 4 * C},
        {"type": "gelu", "name": "act", "approximate": "tanh"}, {"type": "linear", "name": "fc2", "out": C},
        {"type": "add", "name": "res2", "inputs": ["res1", "fc2"]}]
    return {"input": [T], "loss": {"type": "cross_entropy"}, "layers": [
        {"type": "embedding", "name": "wte", "vocab": V, "dim": C},
        {"type": "position_embedding", "name": "wpe", "max_len": T},
        {"type": "repeat", "times": L, "layers": blocks},
        {"type": "layernorm", "name": "ln_f"},
        {"type": "linear", "name": "head", "out": V, "bias": False, "tie": "wte.weight"}]}


def gpt_logits(P, ids, H, L):
    """The logits [B, T, V] of gpt_model's network for token ids [B, T], the parameters P keyed by
    ctrain's view names; computes in P's dtype."""
    B, T = ids.shape
    C = P["wte.weight"].shape[1]

    def lin(x, name):
        return F.linear(x, P[name + ".weight"], P[name + ".bias"])

    def ln(x, name):
        return F.layer_norm(x, (C,), P[name + ".weight"], P[name + ".bias"])

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    x = F.embedding(ids, P["wte.weight"]) + P["wpe.weight"][:T]
    for i in range(L):
        q, k, v = lin(ln(x, "ln1.%d" % i), "qkv.%d" % i).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2) / math.sqrt(C // H)).masked_fill(mask, float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(a, "proj.%d" % i)
        x = x + lin(F.gelu(lin(ln(x, "ln2.%d" % i), "fc1.%d" % i), approximate="tanh"), "fc2.%d" % i)
    return F.linear(ln(x, "ln_f"), P["wte.weight"])


def gpt_small_case():
    """A whole GPT-2-shaped model (test_graph.c, gpt_model above): loss and every parameter's
    gradient, keyed by ctrain's view names."""
    B, T, C, H, V, L = 2, 8, 16, 2, 32, 2
    model = gpt_model(T, C, H, V, L)
    ids = torch.randint(0, V, (B, T + 1))
    P = {"wte.weight": rand(V, C) * 0.5, "wpe.weight": rand(T, C) * 0.2}
    for i in range(L):
        for ln in ("ln1", "ln2"):
            P["%s.%d.weight" % (ln, i)] = 1.0 + 0.2 * rand(C)
            P["%s.%d.bias" % (ln, i)] = 0.1 * rand(C)
        for name, o, n_in in (("qkv", 3 * C, C), ("proj", C, C), ("fc1", 4 * C, C), ("fc2", C, 4 * C)):
            P["%s.%d.weight" % (name, i)] = rand(o, n_in) / math.sqrt(n_in)
            P["%s.%d.bias" % (name, i)] = 0.1 * rand(o)
    P["ln_f.weight"], P["ln_f.bias"] = 1.0 + 0.2 * rand(C), 0.1 * rand(C)
    for t in P.values():
        t.requires_grad_(True)
    logits = gpt_logits(P, ids[:, :-1], H, L)
    loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    arrays = [("ids", ids[:, :-1]), ("target", ids[:, 1:]), ("loss", loss.reshape(1))]
    arrays += [(name, t) for name, t in P.items()] + [("d:" + name, t.grad) for name, t in P.items()]
    write("gpt_small", {"model": model}, arrays)


def llama_layer_cases():
    """Llama's parts from their formulas (transformers' LlamaRMSNorm, LlamaMLP, LlamaAttention with
    apply_rotary_pos_emb and repeat_kv): RMSNorm, SwiGLU over a fused [gate | up], and causal
    attention over a fused [q | k | v] of H query and KV kv heads with rotary positions in the
    half-split (rotate_half) layout; grouped-query (2 of 4, theta 10000) and multi-query with
    linear scaling (1 of 3, theta 500, factor 2)."""
    x, w = rand(3, 4, 6), rand(6)
    run_layer("rmsnorm", {"type": "rmsnorm", "eps": 1e-5}, [x],
              lambda xs, p, _: xs[0] * torch.rsqrt(xs[0].pow(2).mean(-1, keepdim=True) + 1e-5) * p[0], [w])
    x = rand(2, 3, 10) * 2
    run_layer("swiglu", {"type": "swiglu"}, [x], lambda xs, p, _: F.silu(xs[0][..., :5]) * xs[0][..., 5:], [])

    def attention(B, T, H, KV, D, theta, factor, dynamic_max=0):
        def rotate_half(t):
            return torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)

        def attend(xs, _p, _b):
            q, k, v = xs[0].view(B, T, H + 2 * KV, D).split([H, KV, KV], dim=2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))          # [B, heads, T, D]
            base, f = theta, factor
            if dynamic_max and T > dynamic_max:   # transformers' dynamic NTK: a larger base, no divisor
                base, f = theta * ((factor * T / dynamic_max) - (factor - 1)) ** (D / (D - 2)), 1.0
            inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D)) / f
            freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), -1)
            cos, sin = emb.cos(), emb.sin()
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
            s = q @ k.transpose(-1, -2) / math.sqrt(D)
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
        return attend

    B, T, H, KV, D = 2, 6, 4, 2, 4
    run_layer("causal_self_attention_gqa_rope", {"type": "causal_self_attention", "heads": H, "kv_heads": KV,
                                                 "rope_theta": 10000},
              [rand(B, T, (H + 2 * KV) * D)], attention(B, T, H, KV, D, 10000.0, 1.0), [])
    B, T, H, KV, D = 2, 7, 3, 1, 6
    run_layer("causal_self_attention_mqa_linear", {"type": "causal_self_attention", "heads": H, "kv_heads": KV,
                                                   "rope_theta": 500, "rope_scaling": {"type": "linear", "factor": 2}},
              [rand(B, T, (H + 2 * KV) * D)], attention(B, T, H, KV, D, 500.0, 2.0), [])
    B, T, H, KV, D = 1, 9, 2, 2, 8
    run_layer("causal_self_attention_dynamic", {"type": "causal_self_attention", "heads": H, "rope_theta": 100,
                                                "rope_scaling": {"type": "dynamic", "factor": 3,
                                                                 "max_position_embeddings": 4}},
              [rand(B, T, (H + 2 * KV) * D)], attention(B, T, H, KV, D, 100.0, 3.0, dynamic_max=4), [])


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    # new cases last: each case draws from the seeded generator, so earlier files stay as they were
    for make in (linear_cases, conv_cases, pool_cases, norm_cases, activation_cases, shape_cases, loss_cases,
                 tied_lm_case, position_embedding_case, causal_self_attention_case,
                 gpt_small_case, llama_layer_cases):
        make()
    print("wrote", len(os.listdir(OUT)), "files to", OUT)
