"""Small transformer pieces shared by the bridge and the baselines' denoisers and decoders."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _attend(q_proj: Tensor, kv: Tensor, heads: int, causal: bool, dropout: float) -> Tensor:
    """Multi-head scaled dot-product attention; q_proj (n, Tq, d), kv = concat[k, v] (n, Tk, 2d)."""
    n, length, d_model = q_proj.shape
    k, v = kv.split(d_model, dim=-1)
    q, k, v = (x.reshape(n, x.shape[1], heads, d_model // heads).transpose(1, 2) for x in (q_proj, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)
    return out.transpose(1, 2).reshape(n, length, d_model)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: self-attention (causal or bidirectional), an optional
    cross-attention to a memory sequence, and a GELU MLP."""

    def __init__(self, d_model: int, heads: int, dropout: float = 0.0, causal: bool = True, cross: bool = False):
        super().__init__()
        self.heads, self.dropout, self.causal = heads, dropout, causal
        self.attn_norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn_out = nn.Linear(d_model, d_model)
        if cross:
            self.cross_norm = nn.LayerNorm(d_model)
            self.cross_q = nn.Linear(d_model, d_model)
            self.cross_kv = nn.Linear(d_model, 2 * d_model)
            self.cross_out = nn.Linear(d_model, d_model)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, h: Tensor, memory: Tensor | None = None) -> Tensor:
        dropout = self.dropout if self.training else 0.0
        d_model = h.shape[-1]
        q, kv = self.qkv(self.attn_norm(h)).split([d_model, 2 * d_model], dim=-1)
        h = h + self.resid_dropout(self.attn_out(_attend(q, kv, self.heads, self.causal, dropout)))
        if memory is not None:
            x = self.cross_norm(h)
            attended = _attend(self.cross_q(x), self.cross_kv(memory), self.heads, False, dropout)
            h = h + self.resid_dropout(self.cross_out(attended))
        return h + self.mlp(self.mlp_norm(h))


#: the rotary embedding's base: pair j of a head turns by position · ROTARY_BASE^(−2j/head_dim) (Su et al. 2021)
ROTARY_BASE = 10_000.0
#: how a denoiser knows where a token is: rotating queries and keys, or learned absolute vectors added to its input
POSITIONS = ("rotary", "learned")


def rotation(length: int, head_dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos and sin (length, head_dim) of the rotary embedding: position p turns the pair of
    coordinates (j, j + head_dim/2) by the angle p · ROTARY_BASE^(−2j/head_dim)."""
    frequencies = ROTARY_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * frequencies[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (..., length, head_dim) with each position's coordinate pairs turned by its angles: the
    dot product of a rotated query and key then depends on their positions only through the offset."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class RotaryBlock(Block):
    """A bidirectional pre-LN ``Block`` (the same parameters) whose attention rotates queries and
    keys by position (Su et al. 2021, arXiv 2104.09864)."""

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        n, length, d_model = h.shape
        heads = [x.reshape(n, length, self.heads, d_model // self.heads).transpose(1, 2)
                 for x in self.qkv(self.attn_norm(h)).split(d_model, dim=-1)]
        q, k, v = rotate(heads[0], cos, sin), rotate(heads[1], cos, sin), heads[2]
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        h = h + self.resid_dropout(self.attn_out(attended.transpose(1, 2).reshape(n, length, d_model)))
        return h + self.mlp(self.mlp_norm(h))


def bidirectional_blocks(d_model: int, heads: int, dropout: float, layers: int, rotary: bool) -> nn.ModuleList:
    """``layers`` bidirectional pre-LN blocks, rotating queries and keys by position where ``rotary``
    (a denoiser without rotary positions adds its own position vectors to its input)."""
    kind = RotaryBlock if rotary else Block
    return nn.ModuleList(kind(d_model, heads, dropout, causal=False) for _ in range(layers))


def through_blocks(blocks: nn.ModuleList, h: Tensor, heads: int, rotary: bool) -> Tensor:
    """h (n, T, d) through ``blocks`` of :func:`bidirectional_blocks`, rotary ones given each
    position's angles."""
    if not rotary:
        for block in blocks:
            h = block(h)
        return h
    cos, sin = rotation(h.shape[1], h.shape[-1] // heads, h.device)
    for block in blocks:
        h = block(h, cos, sin)
    return h


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Sinusoidal embedding of t ∈ [0, 1] scaled to [0, 1000], as in DDPM (Ho et al. 2020)."""
    half = dim // 2
    frequencies = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=t.dtype) / half)
    angles = 1000.0 * t[:, None] * frequencies[None, :]
    embedding = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
    return F.pad(embedding, (0, dim - 2 * half))  # odd dim: one zero column
