"""The PyTorch side of the language-model benchmarks (bench_lm.py on the CPU, bench_gpt2_gpu.py on
a GPU): GPT-2's pre-norm block, learned positions, a head tied to the token embedding, GPT-2's
init (std 0.02, residual projections 0.02 / sqrt(2 layers), zero biases), the same model ctrain
builds from `transformer_block`; and build_llama, the model of `llama_block` (configs/llama_tiny.json). Imported by the benchmarks' child processes only (torch is not
needed to run the ctrain side)."""
import math


def build_gpt(C, L, H, V, T, flash):
    """A GPT of L blocks, width C, H heads, vocabulary V (rows of the embedding), sequences up to
    T. flash: F.scaled_dot_product_attention (PyTorch 2.x, what nanoGPT uses); otherwise the
    explicit masked softmax, for Debian's PyTorch 1.13, which lacks it."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc1, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            if not flash:
                self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, C // H).permute(2, 0, 3, 1, 4)
            if flash:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
                a = torch.softmax(s.masked_fill(self.mask[:t, :t], float("-inf")), -1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, C))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias") and "ln" not in name:
                    nn.init.zeros_(p)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    return GPT()


def build_llama(C, L, H, KV, I, V, T, theta, eps, flash):
    """A Llama of L blocks, width C, H heads of which KV kv heads, MLP width I, vocabulary V,
    sequences up to T: RMSNorm, rotary positions (rotate_half), grouped-query attention, SwiGLU,
    no biases, the head tied to the embedding; every weight normal(0, 0.02), as llama_block
    initialises. The q, k, v and the gate and up projections are fused linears, as ctrain's."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    D = C // H
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2).float() / D)
    ang = torch.arange(T).float()[:, None] * inv_freq[None, :]
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight

    def rope(t):
        n = t.shape[-2]
        return t * cos[:n] + torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1) * sin[:n]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = RMSNorm(), RMSNorm()
            self.qkv = nn.Linear(C, (H + 2 * KV) * D, bias=False)
            self.proj = nn.Linear(C, C, bias=False)
            self.gate_up = nn.Linear(C, 2 * I, bias=False)
            self.down = nn.Linear(I, C, bias=False)
            if not flash:
                self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, H + 2 * KV, D).split([H, KV, KV], dim=2)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
            q, k = rope(q), rope(k)
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
            if flash:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                a = torch.softmax(s.masked_fill(self.mask[:t, :t], float("-inf")), -1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, C))
            g, u = self.gate_up(self.ln2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, ids):
            x = self.wte(ids)
            for blk in self.blocks:
                x = blk(x)
            return F.linear(self.norm(x), self.wte.weight)

    return Llama()


def adamw_gpt(model, lr, **kw):
    """AdamW with weight decay 0.1 on the 2-D weights only, betas 0.9/0.95 (GPT-2's recipe)."""
    import torch
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), **kw)
