"""The divlab transformer written in PyTorch, parameter for parameter, for parity tests and the
GPU speed baseline. Names match the trace's parameter names (model/transformer.cpp)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, C, n_heads, sdpa=False):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.n_heads = n_heads
        self.sdpa = sdpa  # fused scaled_dot_product_attention (the speed baseline)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        heads = lambda t: t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        q, k, v = heads(q), heads(k), heads(v)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_heads)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C, bias=False)
        self.proj = nn.Linear(4 * C, C, bias=False)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_heads, eps, sdpa=False):
        super().__init__()
        self.ln1, self.attn = RMSNorm(C, eps), Attention(C, n_heads, sdpa)
        self.ln2, self.mlp = RMSNorm(C, eps), MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, d_model, n_layers, n_heads, seq_len, eps=1e-5, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, eps, sdpa) for _ in range(n_layers))
        self.ln_f = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(cfg, step):
    """model/optimizer.cpp's lr_at, for LambdaLR."""
    t = cfg["train"]
    lr, warmup = t["lr"], t["warmup_steps"]
    if step < warmup:
        return lr * (step + 1) / warmup
    if t["schedule"] == "constant":
        return lr
    span = max(1, t["steps"] - warmup)
    progress = min(1.0, (step - warmup) / span)
    return lr * (t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_for(model, cfg):
    """torch.optim with divlab's semantics: no weight decay on RMSNorm gains."""
    t = cfg["train"]
    decay = [p for n, p in model.named_parameters() if not n.endswith("ln1.weight")
             and not n.endswith("ln2.weight") and n != "ln_f.weight"]
    no_decay = [p for n, p in model.named_parameters() if all(p is not q for q in decay)]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    if t["optimizer"] == "adamw":
        opt = torch.optim.AdamW(groups, lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"])
    else:
        opt = torch.optim.SGD(groups, lr=t["lr"], momentum=t["momentum"], nesterov=t["nesterov"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(cfg, s) / t["lr"])
    return opt, sched
