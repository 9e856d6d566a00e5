#!/usr/bin/python3
"""Reference training runs for test/test_train.c, computed with PyTorch.

Run with Debian's python3-torch:  /usr/bin/python3 test/ref/gen_train_refs.py
Writes test/ref/train/:
  <model>_images.idx, <model>_labels.idx   the training data (IDX, f32 images, u8 labels)
  <model>_init.json                        initial weights by ctrain view name
  cases/<case>.json                        a complete ctrain config for the case
  expect.json                              per case, one a line: the loss of each of 3 optimizer
                                           steps and the final weights
Numbers are written with 9 significant digits (float32 round-trips; the files stay small).

The test loads the config, overwrites ctrain's initialised parameters with <model>_init.json
(so no RNG has to agree), trains 3 steps and compares. Optimizers follow ctrain's documented
semantics (core/optim/optim.h): Adam/AdamW as DeepSpeed's FusedAdam (= torch AdamW, or torch Adam
with L2 decay when adam_w_mode is false), SGD = torch.optim.SGD, Lamb = DeepSpeed's FusedLamb
(written out below; torch has none). Weight decay applies to weights, not to biases (two param groups).
Schedules follow DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py): update #1
uses the constructor's LR, update #k uses LR(k - 2).
"""
import json
import math
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "train")
N_SAMPLES, BATCH, STEPS, CLASSES = 24, 8, 3, 5

torch.set_num_threads(1)

# ---- models (names match ctrain's view names: "<layer>.weight", "<layer>.bias") ----

MODELS = {
    "mlp": {
        "input": [16],
        "layers": [
            {"type": "linear", "name": "fc1", "out": 24},
            {"type": "relu", "name": "act1"},
            {"type": "linear", "name": "fc2", "out": CLASSES},
        ],
        "loss": {"type": "cross_entropy"},
    },
    "cnn": {
        "input": [1, 8, 8],
        "layers": [
            {"type": "conv2d", "name": "conv1", "out": 4, "kernel": 3, "padding": 1},
            {"type": "relu", "name": "act1"},
            {"type": "maxpool2d", "name": "pool1", "kernel": 2},
            {"type": "flatten", "name": "flat"},
            {"type": "linear", "name": "fc", "out": CLASSES},
        ],
        "loss": {"type": "cross_entropy"},
    },
}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 24)
        self.fc2 = torch.nn.Linear(24, CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, CLASSES)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        return self.fc(y.flatten(1))


# ---- optimizers and schedules of the cases ----

OPTIMIZERS = {
    "adam": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01}},
    "adam_l2": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01, "adam_w_mode": False}},
    "adamw": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1, "betas": [0.8, 0.99]}},
    "sgd_momentum": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}},
    "sgd_nesterov": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}},
    "lamb": {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}},
}

SCHEDULES = {
    "warmup_lr": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02,
                                                  "warmup_num_steps": 4, "warmup_type": "linear"}},
    "warmup_decay_lr": {"type": "WarmupDecayLR",
                        "params": {"total_num_steps": 4, "warmup_min_lr": 0.001, "warmup_max_lr": 0.02,
                                   "warmup_num_steps": 2, "warmup_type": "log"}},
    "warmup_cosine_lr": {"type": "WarmupCosineLR",
                         "params": {"total_num_steps": 5, "warmup_num_steps": 2, "warmup_min_ratio": 0.1,
                                    "cos_min_ratio": 0.01, "warmup_type": "linear"}},
    "one_cycle": {"type": "OneCycle",
                  "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.02, "cycle_first_step_size": 2,
                             "cycle_momentum": True, "cycle_min_mom": 0.8, "cycle_max_mom": 0.9}},
    "lr_range_test": {"type": "LRRangeTest",
                      "params": {"lr_range_test_min_lr": 0.005, "lr_range_test_step_size": 1,
                                 "lr_range_test_step_rate": 2.0}},
}


def sched_lr(s, base_lr, t):
    """LR of DeepSpeed schedule s at last_batch_iteration t (t = -1: the constructor's value)."""
    if s is None:
        return base_lr
    p, kind = s["params"], s["type"]
    if kind in ("WarmupLR", "WarmupDecayLR"):
        lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)
        if t < 0:
            return lo
        n = max(2, p.get("warmup_num_steps", 1000))
        if t < n:
            g = math.log(t + 1) / math.log(n) if p.get("warmup_type", "log") == "log" else t / n
        elif kind == "WarmupLR":
            g = 1.0
        else:
            total = p["total_num_steps"]
            g = max(0.0, (total - t) / max(1.0, total - n))
        return lo + (hi - lo) * g
    if kind == "WarmupCosineLR":
        if t < 0:
            return 0.0
        n = max(2, p.get("warmup_num_steps", 1000))
        wmin, cmin = p.get("warmup_min_ratio", 0.0), p.get("cos_min_ratio", 0.0001)
        if t < n:
            g = math.log(t + 1) / math.log(n) if p.get("warmup_type", "log") == "log" else t / n
            r = wmin + (1 - wmin) * g
        else:
            c = (1 + math.cos(math.pi * (t - n + 1) / (p["total_num_steps"] - n))) / 2
            r = max(0.0, cmin + (1 - cmin) * c)
        return base_lr * r
    if kind == "OneCycle":
        lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
        if t < 0:
            return lo
        scale, in_cycle = one_cycle_scale(p, t)
        return lo + (hi - lo) * scale if in_cycle else lo  # no decay configured in these cases
    if kind == "LRRangeTest":
        lo = p.get("lr_range_test_min_lr", 1e-3)
        i = (t + 1) / p.get("lr_range_test_step_size", 2000)
        if p.get("lr_range_test_staircase", False):
            i = math.floor(i)
        return lo * (1 + p.get("lr_range_test_step_rate", 1.0) * i)
    raise ValueError(kind)


def one_cycle_scale(p, t):
    first = p.get("cycle_first_step_size", 2000)
    second = p.get("cycle_second_step_size") or first
    total = first + second
    ratio = first / total
    b = t + 1
    x = b / total - math.floor(b / total)
    scale = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
    return scale, t < total


def sched_betas(s, t):
    """OneCycle momentum cycling: (beta1, beta2) or None."""
    if s is None or s["type"] != "OneCycle" or not s["params"].get("cycle_momentum", True):
        return None
    p = s["params"]
    lo, hi = p.get("cycle_min_mom", 0.8), p.get("cycle_max_mom", 0.9)
    if t < 0:
        return (lo, 0.99)
    scale, in_cycle = one_cycle_scale(p, t)
    return (hi - (hi - lo) * scale, 0.99) if in_cycle else (hi, 0.99)


class DeepSpeedLamb:
    """FusedLamb's update (DeepSpeed csrc/lamb): the direction uses raw moments; bias correction
    only scales the step; trust ratio per tensor, clamped, 1 when a norm is 0."""

    def __init__(self, groups, lr, betas=(0.9, 0.999), eps=1e-8, max_coeff=10.0, min_coeff=0.01):
        self.param_groups = [dict(g, lr=lr, betas=betas) for g in groups]
        self.eps, self.max_coeff, self.min_coeff = eps, max_coeff, min_coeff
        self.state, self.t = {}, 0

    @torch.no_grad()
    def step(self):
        self.t += 1
        for g in self.param_groups:
            b1, b2 = g["betas"]
            step_size = g["lr"] * math.sqrt(1 - b2 ** self.t) / (1 - b1 ** self.t)
            for p in g["params"]:
                st = self.state.setdefault(p, {"m": torch.zeros_like(p), "v": torch.zeros_like(p)})
                st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = st["m"] / (st["v"].sqrt() + self.eps) + g["weight_decay"] * p
                wn, un = p.norm().item(), u.norm().item()
                coeff = 1.0
                if wn != 0 and un != 0:
                    coeff = min(max(wn / un, self.min_coeff), self.max_coeff)
                p.add_(u, alpha=-step_size * coeff)


def make_optimizer(opt, model):
    p = opt["params"]
    wd = p.get("weight_decay", 0.0)
    decay = [q for n, q in model.named_parameters() if n.endswith("weight")]
    no_decay = [q for n, q in model.named_parameters() if not n.endswith("weight")]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    betas = tuple(p.get("betas", (0.9, 0.999)))
    kind = opt["type"]
    if kind == "Lamb":
        return DeepSpeedLamb(groups, p["lr"], betas)
    if kind == "SGD":
        return torch.optim.SGD(groups, lr=p["lr"], momentum=p.get("momentum", 0.0),
                               nesterov=p.get("nesterov", False), dampening=p.get("dampening", 0.0))
    eps = p.get("eps", 1e-8)
    if kind == "AdamW" or p.get("adam_w_mode", True):
        return torch.optim.AdamW(groups, lr=p["lr"], betas=betas, eps=eps)
    return torch.optim.Adam(groups, lr=p["lr"], betas=betas, eps=eps)


# ---- files ----

def write_one_case_a_line(cases, f):
    """A JSON object with one case a line, so a regenerated case is a one-line diff."""
    lines = [json.dumps(name) + ":" + json.dumps(case, separators=(",", ":")) for name, case in cases.items()]
    f.write("{\n" + ",\n".join(lines) + "\n}\n")


def write_idx(path, tensor, code):
    dims = list(tensor.shape)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, code, len(dims)]))
        for d in dims:
            f.write(struct.pack(">I", d))
        if code == 0x0D:
            f.write(tensor.contiguous().numpy().astype(">f4").tobytes())
        else:
            f.write(tensor.contiguous().numpy().astype("u1").tobytes())


def short(x):
    """x with 9 significant digits: a float32 reads back exactly, in fewer characters."""
    return float(f"{x:.9g}")


def weights_json(model):
    return {n: {"shape": list(q.shape), "data": [short(float(x)) for x in q.detach().flatten()]}
            for n, q in model.named_parameters()}


def run_case(model_name, opt, sched, clip, micro):
    torch.manual_seed(1)
    model = Mlp() if model_name == "mlp" else Cnn()
    init = weights_json(model)
    x, y = DATA[model_name]
    optim = make_optimizer(opt, model)
    base_lr = opt["params"]["lr"]
    losses = []
    for k in range(1, STEPS + 1):
        t = k - 2
        for g in optim.param_groups:
            g["lr"] = sched_lr(sched, base_lr, t)
            betas = sched_betas(sched, t)
            if betas is not None and "betas" in g:
                g["betas"] = betas
        xb, yb = x[(k - 1) * BATCH:k * BATCH], y[(k - 1) * BATCH:k * BATCH]
        for q in model.parameters():
            q.grad = None
        step_loss = 0.0
        for j in range(0, BATCH, micro):  # micro-batches: loss weighted by their share
            loss = torch.nn.functional.cross_entropy(model(xb[j:j + micro]), yb[j:j + micro].long())
            (loss * (micro / BATCH)).backward()
            step_loss += loss.item() * micro / BATCH
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optim.step()
        losses.append(step_loss)
    return init, losses, weights_json(model)


def config(model_name, opt, sched, clip, micro):
    cfg = {
        "train_batch_size": BATCH,
        "train_micro_batch_size_per_gpu": micro,
        "optimizer": opt,
        "model": MODELS[model_name],
        "data": {"train": {"format": "idx", "images": f"../{model_name}_images.idx",
                           "labels": f"../{model_name}_labels.idx"},
                 "shuffle": False},
        "train": {"epochs": 1, "max_steps": STEPS, "seed": 7, "device": "cpu", "threads": 1},
    }
    if sched:
        cfg["scheduler"] = sched
    if clip > 0:
        cfg["gradient_clipping"] = clip
    return cfg


def main():
    global DATA
    os.makedirs(os.path.join(OUT, "cases"), exist_ok=True)
    torch.manual_seed(0)
    DATA = {"mlp": (torch.randn(N_SAMPLES, 16), torch.randint(0, CLASSES, (N_SAMPLES,))),
            "cnn": (torch.randn(N_SAMPLES, 1, 8, 8), torch.randint(0, CLASSES, (N_SAMPLES,)))}
    for name, (x, y) in DATA.items():
        write_idx(os.path.join(OUT, f"{name}_images.idx"), x.squeeze(1) if name == "cnn" else x, 0x0D)
        write_idx(os.path.join(OUT, f"{name}_labels.idx"), y.to(torch.uint8), 0x08)

    cases = []
    for model_name in MODELS:
        for opt_name in OPTIMIZERS:
            cases.append((f"{model_name}_{opt_name}", model_name, OPTIMIZERS[opt_name], None, 0.0, BATCH))
    for sched_name, sched in SCHEDULES.items():
        opt = {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.01}}
        cases.append((f"mlp_adam_{sched_name}", "mlp", opt, sched, 0.0, BATCH))
    cases.append(("mlp_sgd_clip", "mlp", OPTIMIZERS["sgd_momentum"], None, 0.1, BATCH))
    cases.append(("cnn_adam_accum2", "cnn", OPTIMIZERS["adam"], None, 0.0, BATCH // 2))
    # Cases that a plausible bug changes by far more than the tolerance (Adam hides a wrong
    # gradient scale and eps = 1e-8 matters only for tiny gradients):
    # SGD (an update proportional to the gradient) over 4 micro-batches of the CNN: accumulated
    # gradients kept, divided by the accumulation steps, routed through the maxpool's argmax;
    cases.append(("cnn_sgd_accum4", "cnn", OPTIMIZERS["sgd_momentum"], None, 0.0, BATCH // 4))
    # an eps comparable to sqrt(v): where eps goes (outside the square root, after the bias
    # correction) changes every update;
    cases.append(("mlp_adam_eps", "mlp", {"type": "Adam", "params": {"lr": 1e-2, "eps": 1e-2, "weight_decay": 0.01}},
                  None, 0.0, BATCH))
    # log warm-ups (DeepSpeed's default warmup_type) from a non-zero minimum, SGD: the LR of each
    # of the first steps scales its update directly.
    cases.append(("mlp_sgd_warmup_log_lr", "mlp", {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.5}},
                  {"type": "WarmupLR", "params": {"warmup_min_lr": 0.01, "warmup_max_lr": 0.2,
                                                  "warmup_num_steps": 5}}, 0.0, BATCH))
    cases.append(("mlp_sgd_warmup_cosine_log_lr", "mlp", {"type": "SGD", "params": {"lr": 0.2}},
                  {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 4,
                                                        "warmup_min_ratio": 0.05}}, 0.0, BATCH))

    expect = {}
    for name, model_name, opt, sched, clip, micro in cases:
        init, losses, final = run_case(model_name, opt, sched, clip, micro)
        with open(os.path.join(OUT, f"{model_name}_init.json"), "w") as f:
            json.dump(init, f, separators=(",", ":"))
        with open(os.path.join(OUT, "cases", f"{name}.json"), "w") as f:
            json.dump(config(model_name, opt, sched, clip, micro), f, indent=1)
        expect[name] = {"model": model_name, "losses": [short(x) for x in losses],
                        "final": {n: w["data"] for n, w in final.items()}}
    with open(os.path.join(OUT, "expect.json"), "w") as f:
        write_one_case_a_line(expect, f)
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
