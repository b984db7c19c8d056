"""Multi-head scaled dot-product attention (paper, section 3.2), through
``torch.nn.functional.scaled_dot_product_attention`` so fused kernels are used where
the hardware has them.

Shapes: B sentences, K hypotheses per sentence (beam), N = B*K rows, S source,
T target (new tokens this call), L cached target positions, H heads, D model, d = D/H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.common import masked_softmax, self_attention_mask
from seqtrans.masks import causal_mask, key_mask


def split_heads(x: Tensor, heads: int) -> Tensor:
    """[N, T, D] -> [N, H, T, d]"""
    n, t, d_model = x.shape
    return x.view(n, t, heads, d_model // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[N, H, T, d] -> [N, T, D]"""
    n, h, t, d = x.shape
    return x.transpose(1, 2).reshape(n, t, h * d)


class KVCache:
    """Self-attention keys and values of the tokens decoded so far, preallocated.

    Each step appends the new tokens' keys and values in place; :meth:`reorder`
    follows the search when it reorders or drops hypotheses. Reordering gathers into a
    second buffer of the same size, kept for the next step, and swaps the two: one copy
    of the positions in use, and no fresh allocation (whose page faults cost more than
    the copy) per step.
    """

    def __init__(self, rows: int, heads: int, head_dim: int, capacity: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (rows, heads, capacity, head_dim)  # [N, H, L_max, d]
        self._k = torch.empty(shape, dtype=dtype, device=device)
        self._v = torch.empty(shape, dtype=dtype, device=device)
        self._spare: tuple[Tensor, Tensor] | None = None  # the other buffers, made at the first reorder
        self.rows = rows  # hypotheses in use: the first rows of the buffers
        self.length = 0

    @property
    def k(self) -> Tensor:
        """[N, H, L_max, d]: the keys of the rows in use (positions past ``length`` unset)."""
        return self._k[: self.rows]

    @property
    def v(self) -> Tensor:
        return self._v[: self.rows]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store [N, H, T, d] keys and values; return all of them so far, [N, H, L+T, d]."""
        start, end = self.length, self.length + k.size(2)
        if end > self._k.size(2):  # longer than planned: grow (rare; callers size it right)
            n, h, capacity, d = self._k.shape
            grow = max(end, 2 * capacity) - capacity
            self._k = torch.cat([self._k, self._k.new_empty(n, h, grow, d)], dim=2)
            self._v = torch.cat([self._v, self._v.new_empty(n, h, grow, d)], dim=2)
            self._spare = None
        keys, values = self.k, self.v
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        self.length = end
        return keys[:, :, :end], values[:, :, :end]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` [N'] (indices into the current rows), in that order."""
        if self._spare is None:
            self._spare = (torch.empty_like(self._k), torch.empty_like(self._v))
        used, n = self.length, rows.numel()
        spare_k, spare_v = self._spare
        # only the positions in use are copied; N' <= N rows fit in the spare's first rows
        torch.index_select(self.k[:, :, :used], 0, rows, out=spare_k[:n, :, :used])
        torch.index_select(self.v[:, :, :used], 0, rows, out=spare_v[:n, :, :used])
        self._spare = (self._k, self._v)
        self._k, self._v = spare_k, spare_v
        self.rows = n


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused query/key/value projection.

    ``forward(x [N, T, D], mask=[N, T] | None, causal=bool, cache=KVCache | None) -> [N, T, D]``
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.qkv.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.qkv.bias)
        nn.init.zeros_(self.out.bias)

    def new_cache(self, rows: int, capacity: int, *, like: Tensor) -> KVCache:
        d = self.out.in_features // self.heads
        return KVCache(rows, self.heads, d, capacity, dtype=like.dtype, device=like.device)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [N, T, D]
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))  # [N, H, T, d]
        attn_mask = key_mask(mask) if mask is not None else None  # [N, 1, 1, T]
        is_causal = causal
        if cache is not None:
            k, v = cache.append(k, v)  # [N, H, L+T, d]
            if causal and q.size(2) > 1:
                attn_mask = causal_mask(q.size(2), k.size(2), device=x.device)  # [T, L+T]
            is_causal = False  # a single new query may see every cached key
            if mask is not None:
                raise ValueError("a key padding mask cannot be combined with a cache")
        elif causal and attn_mask is not None:
            attn_mask = attn_mask & causal_mask(q.size(2), k.size(2), device=x.device)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )  # [N, H, T, d]
        return self.out(merge_heads(out))

    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """softmax(q k^T / sqrt(d)) over the allowed keys.  x [N, T, D] -> [N, H, T, T]"""
        q, k, _ = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))  # [N, H, T, d]
        allowed = self_attention_mask(mask, causal=causal, queries=x.size(1), keys=x.size(1),
                                      device=x.device)
        return masked_softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, allowed)


@dataclass
class CrossState:
    """Keys and values of the encoder output, computed once per source.

    ``mask`` is None when no source in the batch is padded (the fused kernels then apply).
    """

    k: Tensor  # [B, H, S, d]
    v: Tensor  # [B, H, S, d]
    mask: Tensor | None  # [B, 1, 1, S]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        if sentences is not None:
            self.k = self.k.index_select(0, sentences)
            self.v = self.v.index_select(0, sentences)
            if self.mask is not None:
                self.mask = self.mask.index_select(0, sentences)


class CrossAttention(nn.Module):
    """Multi-head encoder-decoder attention.

    The hypotheses of one sentence share its keys and values: their queries are folded
    into the query axis, so beams never copy the encoder output.
    ``forward(x [N, T, D], state) -> [N, T, D]`` with N a multiple of the state's B.
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        for lin in (self.q, self.kv, self.out):
            nn.init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2) if lin is not self.out else 1.0)
            nn.init.zeros_(lin.bias)

    def prepare(self, memory: Tensor, mask: Tensor) -> CrossState:
        """memory [B, S, D], mask [B, S] (True at real tokens) -> keys and values per head."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # 2 x [B, S, D]
        padded = not bool(mask.all())
        return CrossState(split_heads(k, self.heads), split_heads(v, self.heads),
                          key_mask(mask) if padded else None)

    def forward(self, x: Tensor, state: CrossState) -> Tensor:
        n, t, d_model = x.shape
        b = state.k.size(0)
        beam = n // b
        q = self.q(x).view(b, beam, t, self.heads, d_model // self.heads)  # [B, K, T, H, d]
        q = q.permute(0, 3, 1, 2, 4).reshape(b, self.heads, beam * t, -1)  # [B, H, K*T, d]
        out = F.scaled_dot_product_attention(
            q, state.k, state.v, attn_mask=state.mask,
            dropout_p=self.dropout if self.training else 0.0,
        )  # [B, H, K*T, d]
        out = out.view(b, self.heads, beam, t, -1).permute(0, 2, 3, 1, 4)  # [B, K, T, H, d]
        return self.out(out.reshape(n, t, d_model))

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, D], memory [B, S, D], mask [B, S] -> [B, H, T, S]"""
        q = split_heads(self.q(x), self.heads)  # [B, H, T, d]
        k = split_heads(self.kv(memory).chunk(2, dim=-1)[0], self.heads)  # [B, H, S, d]
        return masked_softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, key_mask(mask))
