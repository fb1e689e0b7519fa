"""The bf16 decoder every variant of bench_model.py starts from: Llama-3-8B-shaped blocks by default (RMSNorm,
RoPE, SDPA against a KV cache, fused qkv and gate/up), fed hidden states; the tensor-parallel world its blocks
all-reduce in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Config:
    dim: int = 4096
    heads: int = 32
    kv_heads: int = 8
    hidden: int = 14336
    layers: int = 4
    eps: float = 1e-5
    rope_base: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


FULL = Config()
SMALL = Config(dim=512, heads=8, kv_heads=2, hidden=1792)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, hd] rotated by position; cos / sin [T, hd / 2]."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).to(x.dtype)


def split_heads(
    qkv: torch.Tensor, heads: int, kv_heads: int, hd: int, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A fused qkv projection [B, T, (heads + 2 kv_heads) hd] -> q, k (rotated) and v as [B, heads, T, hd]."""
    b, t, _ = qkv.shape
    q, k, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
    q = rope(q.view(b, t, heads, hd), cos, sin).transpose(1, 2)
    k = rope(k.view(b, t, kv_heads, hd), cos, sin).transpose(1, 2)
    return q, k, v.view(b, t, kv_heads, hd).transpose(1, 2)


class TP:
    """The tensor-parallel world the model runs in (rank 0 of 1 without --tp)."""

    def __init__(self, rank: int = 0, world: int = 1, group: Any = None) -> None:
        self.rank, self.world, self.group = rank, world, group

    def __deepcopy__(self, memo: dict) -> TP:  # one world shared by every variant's copy of the model
        return self

    def all_reduce(self, y: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return y
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_reduce(y, "sum", self.group)


class Block(nn.Module):
    def __init__(self, cfg: Config, tp: TP) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp
        hd = cfg.head_dim
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads  # local counts after `shard`
        self.qkv = nn.Linear(cfg.dim, (cfg.heads + 2 * cfg.kv_heads) * hd, bias=False)
        self.o = nn.Linear(cfg.heads * hd, cfg.dim, bias=False)
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.hidden, bias=False)
        self.down = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.attn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.ffn_norm = nn.Parameter(torch.ones(cfg.dim))
        self.register_buffer("k_cache", torch.empty(0), persistent=False)
        self.register_buffer("v_cache", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        qkv = self.qkv(rms_norm(x, self.attn_norm, self.cfg.eps))
        q, k, v = split_heads(qkv, self.heads, self.kv_heads, hd, cos, sin)
        self.k_cache[:b, :, start : start + t] = k
        self.v_cache[:b, :, start : start + t] = v
        keys, values = self.k_cache[:b, :, : start + t], self.v_cache[:b, :, : start + t]
        # decode (t == 1) attends to the whole cache; prefill starts at 0, so causal is the mask. A branch, not
        # `is_causal=t > 1`: with a symbolic t that is a SymBool, which SDPA refuses (a graph break).
        if t > 1:
            y = F.scaled_dot_product_attention(q, keys, values, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
        x = x + self.tp.all_reduce(self.o(y.transpose(1, 2).reshape(b, t, self.heads * hd)))
        gate, up = self.gate_up(rms_norm(x, self.ffn_norm, self.cfg.eps)).chunk(2, dim=-1)
        return x + self.tp.all_reduce(self.down(F.silu(gate) * up))


class Decoder(nn.Module):
    """`cfg.layers` blocks and a final RMSNorm over hidden states [B, T, dim]; `start` is the position of the
    first of the T tokens (decode: the cache length; prefill: 0)."""

    def __init__(self, cfg: Config, tp: TP) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Block(cfg, tp) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.dim))
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def setup_cache(self, batch: int, seq: int) -> None:
        """KV caches for `batch` sequences of `seq` positions (random contents: a cache already filled)."""
        dev, hd = self.norm.device, self.cfg.head_dim
        g = torch.Generator(device=dev).manual_seed(1)
        for blk in self.layers:
            shape = (batch, blk.kv_heads, seq, hd)
            blk.k_cache = torch.randn(shape, generator=g, device=dev, dtype=DTYPE)
            blk.v_cache = torch.randn(shape, generator=g, device=dev, dtype=DTYPE)
        inv = 1.0 / self.cfg.rope_base ** (torch.arange(0, hd, 2, device=dev).float() / hd)
        angles = torch.outer(torch.arange(seq, device=dev).float(), inv)
        self.cos, self.sin = angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        t = x.shape[1]
        cos, sin = self.cos[start : start + t], self.sin[start : start + t]
        for blk in self.layers:
            x = blk(x, start, cos, sin)
        return rms_norm(x, self.norm, self.cfg.eps)


def build_base(cfg: Config, device: str, tp: TP) -> Decoder:
    """The bf16 model every variant starts from: the same random weights (seed 0) on every rank."""
    torch.manual_seed(0)
    with torch.device(device):  # initialized where it runs: 8B-shaped layers are slow to fill on a CPU
        model = Decoder(cfg, tp)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    return model.to(device=device, dtype=DTYPE).requires_grad_(False)
