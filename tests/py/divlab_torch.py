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
    def __init__(self, C, hidden):
        super().__init__()
        self.fc = nn.Linear(C, hidden, bias=False)
        self.proj = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, n_heads, eps, hidden, sdpa=False):
        super().__init__()
        self.ln1, self.attn = RMSNorm(C, eps), Attention(C, n_heads, sdpa)
        self.ln2, self.mlp = RMSNorm(C, eps), MLP(C, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def add_head(model, vocab, d_model, eps, tied, softcap):
    """The final norm and LM head as the model's own ln_f and lm_head (the trace's names); tied:
    no lm_head, the token embedding serves."""
    model.ln_f = RMSNorm(d_model, eps)
    if not tied:
        model.lm_head = nn.Linear(d_model, vocab, bias=False)
    model.tied, model.softcap = tied, softcap


def head_loss(model, x, targets):
    """Logits (soft-capped Gemma-style if configured) and the mean cross-entropy."""
    weight = model.wte.weight if model.tied else model.lm_head.weight
    logits = F.linear(model.ln_f(x), weight)
    if model.softcap > 0:
        logits = model.softcap * torch.tanh(logits / model.softcap)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def loss_after_embedding(model, x, targets):
    """The blocks, the final norm, the head and the loss on the embedding sum x (either family):
    a twin of an embedding-gradient kernel takes the gradient of x and scatters it itself."""
    for block in model.blocks:
        x = block(x)
    return head_loss(model, x, targets)


class Transformer(nn.Module):
    def __init__(self, vocab, d_model, n_layers, n_heads, seq_len, eps=1e-5, sdpa=False,
                 tied=False, softcap=0.0, hidden=0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        hidden = hidden or 4 * d_model
        self.blocks = nn.ModuleList(Block(d_model, n_heads, eps, hidden, sdpa)
                                    for _ in range(n_layers))
        add_head(self, vocab, d_model, eps, tied, softcap)

    def embed(self, idx):
        return self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))

    def forward(self, idx, targets):
        return loss_after_embedding(self, self.embed(idx), targets)


def rotary(x, base):
    """RoPE on (B, T, H, D), Hugging Face's rotate_half form: channel i pairs with i + D/2."""
    T, D = x.shape[1], x.shape[3]
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64, device=x.device) / D)
    angle = torch.outer(torch.arange(T, dtype=torch.float64, device=x.device), inv_freq)
    cos = torch.cat([angle.cos(), angle.cos()], -1).to(x.dtype)[None, :, None, :]
    sin = torch.cat([angle.sin(), angle.sin()], -1).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, C, n_heads, n_kv_heads, rope_base, sdpa=False):
        super().__init__()
        self.hd = C // n_heads
        self.qkv = nn.Linear(C, (n_heads + 2 * n_kv_heads) * self.hd, bias=False)
        self.proj = nn.Linear(C, C, bias=False)
        self.n_heads, self.n_kv_heads, self.rope_base = n_heads, n_kv_heads, rope_base
        self.sdpa = sdpa  # fused scaled_dot_product_attention (the speed baseline)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split([C, self.n_kv_heads * self.hd, self.n_kv_heads * self.hd], 2)
        q = rotary(q.view(B, T, self.n_heads, self.hd), self.rope_base)
        k = rotary(k.view(B, T, self.n_kv_heads, self.hd), self.rope_base)
        v = v.view(B, T, self.n_kv_heads, self.hd)
        group = self.n_heads // self.n_kv_heads  # query head h reads kv head h // group
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, C, hidden):
        super().__init__()
        self.fc = nn.Linear(C, 2 * hidden, bias=False)  # gate rows, then up rows
        self.proj = nn.Linear(hidden, C, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    def __init__(self, C, n_heads, n_kv_heads, hidden, rope_base, eps, sdpa=False):
        super().__init__()
        self.ln1 = RMSNorm(C, eps)
        self.attn = LlamaAttention(C, n_heads, n_kv_heads, rope_base, sdpa)
        self.ln2, self.mlp = RMSNorm(C, eps), SwiGLU(C, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Llama(nn.Module):
    def __init__(self, vocab, d_model, n_layers, n_heads, n_kv_heads, hidden, rope_base,
                 eps=1e-5, tied=False, softcap=0.0, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(LlamaBlock(d_model, n_heads, n_kv_heads, hidden, rope_base,
                                               eps, sdpa) for _ in range(n_layers))
        add_head(self, vocab, d_model, eps, tied, softcap)

    def embed(self, idx):
        return self.wte(idx)

    def forward(self, idx, targets):
        return loss_after_embedding(self, self.embed(idx), targets)


def from_config(m, sdpa=False):
    """The twin of a trace's [model] table (config_toml); sdpa: fused attention (benchmarks)."""
    tied, cap = m.get("tied_embeddings", False), m.get("logit_softcap", 0.0)
    if m.get("arch", "gpt2") == "llama":
        C = m["d_model"]
        hidden = m["mlp_hidden"] or -(-int(8 * C / 3) // 64) * 64  # rounded up to 64
        return Llama(m["vocab"], C, m["n_layers"], m["n_heads"], m["n_kv_heads"] or m["n_heads"],
                     hidden, m["rope_base"], m["norm_eps"], tied, cap, sdpa)
    return Transformer(m["vocab"], m["d_model"], m["n_layers"], m["n_heads"], m["seq_len"],
                       m["norm_eps"], tied=tied, softcap=cap, sdpa=sdpa,
                       hidden=m.get("mlp_hidden", 0))


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
