#!/usr/bin/python3
"""Small random Llama-family models in Hugging Face's layout, for test/e2e_hf_llama.sh (issue #31:
Llama weights in and out). Three cases of 2 layers, 32 wide, 4 heads of 8, MLP 48, vocabulary 64,
sequences of 16, RoPE theta 10000, rms_norm_eps 1e-5:
  gqa    grouped-query attention, 2 kv heads, untied head
  mqa    multi-query attention, 1 kv head, untied head
  tied   2 kv heads, the head tied to the embeddings (tie_word_embeddings)

  gen_hf_llama.py --refs         (torch; transformers when importable) write test/ref/hf_llama/:
                                 eval.bin (4 sequences, ctrain's token file) and expect.json: per
                                 case the eval loss and the first step's gradients (each tensor's
                                 norm and 8 of its elements) of a float64 forward written from
                                 Llama's formulas, and, when transformers is there, the loss that
                                 LlamaForCausalLM computes in fp32 from the same directory
  gen_hf_llama.py --weights DIR --case CASE [--shards] [--drop NAME] [--extra NAME]
                  [--set KEY=JSON ...]
                                 (standard library only) write the case as LlamaForCausalLM's
                                 save_pretrained does: DIR/config.json and DIR/model.safetensors,
                                 or two shards and model.safetensors.index.json (--shards); a tensor
                                 left out or added, a config.json key changed (the error cases)
  gen_hf_llama.py --config CASE OUT.json [--set KEY=JSON ...]
                                 (standard library only) ctrain's config of the case, loading
                                 init_from "hf" (the directory beside OUT.json); --set changes a
                                 key by its dotted path (optimizer.params.lr=1.0)
  gen_hf_llama.py --live-loss DIR OUT.json
                                 (transformers) its fp32 eval loss of the model in DIR on eval.bin's
                                 sequences (rope scaling: ctrain's export of a model trained here)
  gen_hf_llama.py --live CASE DIR CKPT_DIR OUT.json
                                 (transformers) transformers loads DIR (ctrain's export), and
                                 writes OUT.json: its fp32 eval loss, logits identical to those of
                                 the original weights, and its gradients against the ones ctrain's
                                 SGD step of lr 1 wrote in CKPT_DIR's export

The weights are not committed: they come from random.Random(SEED + case), whose sequence Python
guarantees, as multiples of 2^-15 times powers of two, exact in float32, so the test rebuilds them
bit for bit without torch. References are float64 on those exact weights: ctrain's fp32 error is
its own."""
import json
import math
import os
import random
import struct
import sys
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_llama")
T, C, H, D, I, V, L = 16, 32, 4, 8, 48, 64, 2
THETA, EPS = 10000.0, 1e-5
N_EVAL = 4
SEED = 3131
CASES = {"gqa": {"kv": 2, "tied": False}, "mqa": {"kv": 1, "tied": False}, "tied": {"kv": 2, "tied": True}}
LR = 1024.0               # the SGD step whose change is the gradient (a power of two: exact)
SAMPLES = 8                 # gradient elements kept per tensor


def hf_specs(case):
    """(name, shape, scale, offset) in LlamaForCausalLM's order. Scales are powers of two:
    embeddings +-1/4, weights +-1/8 (about 1/sqrt(fan_in) of 32), down_proj +-1/16, norms 1 +- 1/8."""
    kv = CASES[case]["kv"]
    specs = [("model.embed_tokens.weight", (V, C), 2.0 ** -2, 0.0)]
    for i in range(L):
        p = "model.layers.%d." % i
        specs += [(p + "input_layernorm.weight", (C,), 2.0 ** -3, 1.0),
                  (p + "self_attn.q_proj.weight", (H * D, C), 2.0 ** -3, 0.0),
                  (p + "self_attn.k_proj.weight", (kv * D, C), 2.0 ** -3, 0.0),
                  (p + "self_attn.v_proj.weight", (kv * D, C), 2.0 ** -3, 0.0),
                  (p + "self_attn.o_proj.weight", (C, H * D), 2.0 ** -3, 0.0),
                  (p + "post_attention_layernorm.weight", (C,), 2.0 ** -3, 1.0),
                  (p + "mlp.gate_proj.weight", (I, C), 2.0 ** -3, 0.0),
                  (p + "mlp.up_proj.weight", (I, C), 2.0 ** -3, 0.0),
                  (p + "mlp.down_proj.weight", (C, I), 2.0 ** -4, 0.0)]
    specs.append(("model.norm.weight", (C,), 2.0 ** -3, 1.0))
    if not CASES[case]["tied"]:
        specs.append(("lm_head.weight", (V, C), 2.0 ** -3, 0.0))
    return specs


def weights(case):
    """{name: (shape, flat list)}: offset + k / 2^15 * scale, exact in float32."""
    rng = random.Random(SEED + sorted(CASES).index(case))
    return {name: (shape, [offset + (rng.randrange(65536) - 32768) / 32768.0 * scale for _ in range(math.prod(shape))])
            for name, shape, scale, offset in hf_specs(case)}


def hf_config(case):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
            "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": H,
            "num_key_value_heads": CASES[case]["kv"], "hidden_act": "silu", "max_position_embeddings": 64,
            "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
            "tie_word_embeddings": CASES[case]["tied"], "attention_bias": False, "mlp_bias": False,
            "attention_dropout": 0.0, "initializer_range": 0.02, "torch_dtype": "float32"}


def eval_tokens():
    rng = random.Random(SEED - 1)
    return [rng.randrange(V) for _ in range(N_EVAL * T + 1)]


def sequences():
    """Sample s is the window of T + 1 tokens at s * T (docs/formats.md, tokens)."""
    toks = eval_tokens()
    return [toks[s * T:s * T + T + 1] for s in range(N_EVAL)]


def set_path(obj, path, value):
    """obj at the dotted path ("a.b[1].c") set to value; null removes the key."""
    import re
    keys = []
    for part in path.split("."):
        m = re.fullmatch(r"([^\[]+)((?:\[\d+\])*)", part)
        keys.append(m.group(1))
        keys += [int(i) for i in re.findall(r"\[(\d+)\]", m.group(2))]
    for k in keys[:-1]:
        obj = obj[k] if isinstance(k, int) else obj.setdefault(k, {})
    if value is None and not isinstance(keys[-1], int):
        obj.pop(keys[-1], None)
    else:
        obj[keys[-1]] = value


def parse_sets(argv):
    out, rest, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--set" and i + 1 < len(argv):
            k, v = argv[i + 1].split("=", 1)
            out.append((k, json.loads(v)))
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return out, rest


# ---- the files (standard library only) ----

def write_safetensors(path, tensors):
    """tensors: {name: (shape, floats)} as F32. u64 header length, the JSON header padded with
    spaces to a multiple of 8, the data."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        shape, v = tensors[name]
        raw = struct.pack("<%df" % len(v), *v)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    """{name: (shape, floats)} of an F32/BF16 file, and its metadata."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        raw = blob[8 + n + a:8 + n + b]
        if h["dtype"] == "F32":
            v = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        else:
            v = [struct.unpack("<f", b"\0\0" + raw[k:k + 2])[0] for k in range(0, len(raw), 2)]
        out[name] = (tuple(h["shape"]), v)
    return out, meta


def write_weights(argv):
    sets, argv = parse_sets(argv)
    opts = {"--weights": None, "--case": None, "--drop": None, "--extra": None}
    shards, i = False, 0
    while i < len(argv):
        if argv[i] == "--shards":
            shards, i = True, i + 1
        elif argv[i] in opts and i + 1 < len(argv):
            opts[argv[i]], i = argv[i + 1], i + 2
        else:
            sys.exit("gen_hf_llama.py: unexpected argument %r (see the docstring)" % argv[i])
    out, case = opts["--weights"], opts["--case"]
    os.makedirs(out, exist_ok=True)
    w = weights(case)
    if opts["--drop"]:
        del w[opts["--drop"]]
    if opts["--extra"]:
        w[opts["--extra"]] = ((C,), [0.5] * C)
    cfg = hf_config(case)
    for k, v in sets:
        set_path(cfg, k, v)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for old in ("model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"):
        if os.path.exists(os.path.join(out, old)):
            os.remove(os.path.join(out, old))
    if not shards:
        write_safetensors(os.path.join(out, "model.safetensors"), w)
        return
    names = sorted(w)
    parts = [names[:len(names) // 2], names[len(names) // 2:]]
    index = {"metadata": {"total_size": 4 * sum(len(v) for _, v in w.values())}, "weight_map": {}}
    for k, part in enumerate(parts):
        fname = "model-%05d-of-00002.safetensors" % (k + 1)
        write_safetensors(os.path.join(out, fname), {n: w[n] for n in part})
        index["weight_map"].update({n: fname for n in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)


def ctrain_config(case):
    kv, tied = CASES[case]["kv"], CASES[case]["tied"]
    head = {"type": "linear", "name": "lm_head", "out": V, "bias": False}
    if tied:
        head["tie"] = "wte.weight"
    return {
        "train_batch_size": N_EVAL, "train_micro_batch_size_per_gpu": N_EVAL,
        # lr 0: a one-step run evaluates and saves the weights exactly as loaded
        "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
        "model": {"input": [T], "init_from": "hf", "layers": [
            {"type": "embedding", "name": "wte", "vocab": V, "dim": C},
            {"type": "repeat", "times": L, "layers": [
                {"type": "llama_block", "heads": H, "kv_heads": kv, "intermediate": I, "rope_theta": THETA,
                 "eps": EPS}]},
            {"type": "rmsnorm", "name": "norm", "eps": EPS}, head],
            "loss": {"type": "cross_entropy"}},
        "data": {"train": {"format": "tokens", "path": "eval.bin", "seq_len": T},
                 "eval": {"format": "tokens", "path": "eval.bin", "seq_len": T}, "shuffle": False},
        "train": {"epochs": 1, "max_steps": 1, "seed": 7, "device": "cpu", "threads": 2},
    }


def write_config(argv):
    sets, argv = parse_sets(argv)
    case, path = argv
    cfg = ctrain_config(case)
    for k, v in sets:
        set_path(cfg, k, v)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)


# ---- references (torch) ----

def llama_loss(P, ids, case, torch, F):
    """Llama's forward from its formulas (transformers' LlamaForCausalLM, eager attention), on the
    parameters P keyed by Hugging Face's names, in P's dtype: the mean cross entropy of ids[:, 1:]."""
    kv = CASES[case]["kv"]
    x_ids, y = ids[:, :-1], ids[:, 1:]
    B = x_ids.shape[0]
    dt = P["model.norm.weight"].dtype

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    def rotate_half(t):
        return torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)

    inv_freq = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=dt) / D)
    ang = torch.arange(T, dtype=dt)[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    x = P["model.embed_tokens.weight"][x_ids]
    for i in range(L):
        p = "model.layers.%d." % i
        h = rms(x, P[p + "input_layernorm.weight"])
        q = F.linear(h, P[p + "self_attn.q_proj.weight"]).view(B, T, H, D).transpose(1, 2)
        k = F.linear(h, P[p + "self_attn.k_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        v = F.linear(h, P[p + "self_attn.v_proj.weight"]).view(B, T, kv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // kv, dim=1), v.repeat_interleave(H // kv, dim=1)
        s = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(mask, float("-inf"))
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * D)
        x = x + F.linear(a, P[p + "self_attn.o_proj.weight"])
        h = rms(x, P[p + "post_attention_layernorm.weight"])
        x = x + F.linear(F.silu(F.linear(h, P[p + "mlp.gate_proj.weight"])) * F.linear(h, P[p + "mlp.up_proj.weight"]),
                         P[p + "mlp.down_proj.weight"])
    head = P["model.embed_tokens.weight" if CASES[case]["tied"] else "lm_head.weight"]
    logits = F.linear(rms(x, P["model.norm.weight"]), head)
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def sample_at(n):
    """The SAMPLES element indices kept of a tensor of n elements (spread, deterministic)."""
    return sorted({(k * 7919 + 13) % n for k in range(SAMPLES)})


def case_refs(case, torch, F):
    P = {n: torch.tensor(v, dtype=torch.float64).reshape(s).requires_grad_(True) for n, (s, v) in weights(case).items()}
    ids = torch.tensor(sequences())
    loss = llama_loss(P, ids, case, torch, F)
    loss.backward()
    grads = {}
    for n, t in P.items():
        g = t.grad.reshape(-1)
        grads[n] = {"norm": float("%.12g" % g.norm().item()),
                    "at": [[j, float("%.12g" % g[j].item())] for j in sample_at(g.numel())]}
    ref = {"eval_loss": float("%.12g" % loss.item()), "grads": grads}
    try:
        import transformers
    except ImportError:
        return ref
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        write_weights(["--weights", d, "--case", case])
        m = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").float().eval()
        with torch.no_grad():   # the window's next tokens, as ctrain's tokens format pairs them
            logits = m(ids[:, :-1]).logits
        hf = F.cross_entropy(logits.reshape(-1, V).double(), ids[:, 1:].reshape(-1)).item()
    ref["transformers"] = {"version": transformers.__version__, "torch": torch.__version__,
                           "eval_loss_fp32": float("%.12g" % hf)}
    return ref


def write_refs():
    import torch
    import torch.nn.functional as F
    os.makedirs(OUT, exist_ok=True)
    toks = eval_tokens()
    head = b"CTTOKENS" + struct.pack("<IIQI", 1, 2, len(toks), V)
    with open(os.path.join(OUT, "eval.bin"), "wb") as f:
        f.write(head + struct.pack("<I", zlib.crc32(head)) + struct.pack("<%dH" % len(toks), *toks))
    refs = {"tokens": len(toks), "seed": SEED, "cases": {case: case_refs(case, torch, F) for case in sorted(CASES)}}
    with open(os.path.join(OUT, "expect.json"), "w") as f:
        json.dump(refs, f, separators=(",", ":"))
    for case, r in refs["cases"].items():
        print("%-5s eval loss %.9f (float64)%s" % (case, r["eval_loss"], "; transformers fp32 %.9f" %
              r["transformers"]["eval_loss_fp32"] if "transformers" in r else ""))
    print("wrote", OUT)


# ---- the live check (transformers) ----

def live(argv):
    """transformers loads ctrain's export DIR: the eval loss in fp32, the logits against the
    original weights', and the gradients against ctrain's (the SGD step of lr 1 exported in GRAD_DIR:
    the gradient is the weights' change)."""
    import torch
    import torch.nn.functional as F
    import transformers
    import tempfile
    case, export_dir, grad_dir, out_path = argv
    ids = torch.tensor(sequences())
    m = transformers.LlamaForCausalLM.from_pretrained(export_dir, attn_implementation="eager").float()
    logits = m(ids[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    with tempfile.TemporaryDirectory() as d:
        write_weights(["--weights", d, "--case", case])
        orig = transformers.LlamaForCausalLM.from_pretrained(d, attn_implementation="eager").float()
        with torch.no_grad():
            same_logits = bool(torch.equal(orig(ids[:, :-1]).logits, logits.detach()))
    stepped, _ = read_safetensors(os.path.join(grad_dir, "model.safetensors"))
    start, _ = read_safetensors(os.path.join(export_dir, "model.safetensors"))
    worst = 0.0
    params = dict(m.named_parameters())
    for name, (shape, w1) in stepped.items():
        ours = (torch.tensor(start[name][1], dtype=torch.float64) - torch.tensor(w1, dtype=torch.float64)) / LR
        theirs = params[name].grad.double().reshape(-1)
        worst = max(worst, ((ours - theirs).norm() / theirs.norm()).item())
    res = {"transformers": transformers.__version__, "torch": torch.__version__, "eval_loss_fp32": loss.item(),
           "same_logits_as_original": same_logits, "grad_worst_rel_l2": worst, "tensors": len(stepped)}
    with open(out_path, "w") as f:
        json.dump(res, f)
    print(json.dumps(res))


def live_loss(argv):
    """transformers' fp32 eval loss of the model directory DIR (any Llama of vocabulary V on the
    sequences of eval.bin), and the rope_scaling it read, into OUT.json."""
    import torch
    import torch.nn.functional as F
    import transformers
    model_dir, out_path = argv
    m = transformers.LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="eager").float()
    ids = torch.tensor(sequences())
    with torch.no_grad():
        loss = F.cross_entropy(m(ids[:, :-1]).logits.reshape(-1, V), ids[:, 1:].reshape(-1)).item()
    with open(out_path, "w") as f:
        json.dump({"eval_loss_fp32": loss, "rope_scaling": m.config.rope_scaling}, f)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--refs":
        write_refs()
    elif len(sys.argv) > 1 and sys.argv[1] == "--config":
        write_config(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--live":
        live(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--live-loss":
        live_loss(sys.argv[2:])
    elif len(sys.argv) > 1:
        write_weights(sys.argv[1:])
    else:
        sys.exit(__doc__)
