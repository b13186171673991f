"""A small GPT-style transformer shipped for the demo and the tests (no weights to download)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    vocab_size: int = 8192
    max_seq_len: int = 256


GPT2_SMALL = GPTConfig(n_layer=12, d_model=768, n_head=12, vocab_size=50257, max_seq_len=1024)


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        # [b, s, d] -> [b, heads, s, d / heads]
        q, k, v = (t.view(b, s, self.n_head, d // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-shaped decoder. ``GPT(GPT2_SMALL)`` has GPT-2 small's shapes."""

    def __init__(self, cfg: GPTConfig = GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 4
    n_kv_head: int = 2
    ffn: int = 172
    vocab_size: int = 256
    norm_eps: float = 1e-5


# Llama-2-70B's shapes: 80 layers, d 8192, 64 query heads sharing 8 key/value heads, FFN 28672
LLAMA2_70B = LlamaConfig(n_layer=80, d_model=8192, n_head=64, n_kv_head=8, ffn=28672,
                         vocab_size=32000)


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GQAttention(nn.Module):
    """Grouped-query attention with rotary positions; key/value heads are repeated to the
    query heads before attention, as the reference implementation does."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.d_head = cfg.d_model // cfg.n_head
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * self.d_head, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.d_head, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.d_head, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * self.d_head, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_head, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv_head, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv_head, self.d_head).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        groups = self.n_head // self.n_kv_head
        k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = GQAttention(cfg)
        self.post_attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.input_norm(x), cos, sin)
        return x + self.mlp(self.post_attention_norm(x))


class Llama(nn.Module):
    """Llama-shaped decoder (RMSNorm, rotary, GQA, SwiGLU). ``Llama(LLAMA2_70B)`` built under
    ``torch.device("meta")`` has 70B parameters and no memory behind them."""

    def __init__(self, cfg: LlamaConfig = LlamaConfig()):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx):
        s, d_head = idx.shape[1], self.cfg.d_model // self.cfg.n_head
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d_head, 2, device=idx.device) / d_head)
        angles = torch.outer(torch.arange(s, device=idx.device, dtype=inv_freq.dtype), inv_freq)
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))
