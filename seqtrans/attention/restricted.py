"""Restricted self-attention (Vaswani et al. 2017, section 4 and Table 1): each position
attends only to the positions at most r away, for O(r * n * d) work per layer instead of
O(n^2 * d), and a maximum path length of O(n / r).

Multi-head scaled dot-product attention within the window. A full sequence is computed
on windows gathered with ``unfold`` (no n x n score matrix is formed); with a cache, the
new queries attend to the last r cached positions at most.

Shapes: N rows, T positions (new ones this call), L cached positions, H heads,
W = 2r + 1 window, D model, d = D/H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.attention.cache import KVCache
from seqtrans.attention.common import masked_softmax, self_attention_mask
from seqtrans.attention.scaled_dot import SelfAttention, merge_heads, split_heads
from seqtrans.model.dropout import Dropout


class RestrictedSelfAttention(SelfAttention):
    """``forward(x [N, T, D], mask=[N, T] | None, causal=bool, cache=KVCache | None) -> [N, T, D]``

    The projections, their initialisation and the cache are :class:`SelfAttention`'s; only
    the attention itself is restricted to the window.
    """

    def __init__(self, d_model: int, heads: int, *, radius: int, dropout: float = 0.0) -> None:
        super().__init__(d_model, heads, dropout=dropout)
        self.radius = radius
        self.weight_dropout = Dropout(dropout)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None, position_bias: Tensor | None = None) -> Tensor:
        if position_bias is not None:
            raise ValueError("restricted attention takes no position bias (model.positions=relative)")
        q, k, v = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))  # [N, H, T, d]
        q = q * q.size(-1) ** -0.5
        if cache is None:
            out = self._windows(q, k, v, mask, causal)
        else:
            if mask is not None:
                raise ValueError("a key padding mask cannot be combined with a cache")
            out = self._cached(q, *cache.append(k, v), causal)
        return self.out(merge_heads(out))

    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                position_bias: Tensor | None = None) -> Tensor:
        """The window's weights placed in the full matrix, zero outside it.  x [N, T, D] -> [N, H, T, T]"""
        if position_bias is not None:
            raise ValueError("restricted attention takes no position bias (model.positions=relative)")
        q, k, _ = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))  # [N, H, T, d]
        t = x.size(1)
        pos = torch.arange(t, device=x.device)
        allowed = self_attention_mask(mask, causal=causal, queries=t, keys=t, device=x.device)
        band = (pos[None, :] - pos[:, None]).abs() <= self.radius  # [T, T]
        allowed = band if allowed is None else allowed & band
        return masked_softmax(q @ k.transpose(-1, -2) * q.size(-1) ** -0.5, allowed)

    def _windows(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """Each position against its window of 2r+1 keys.  -> [N, H, T, d]"""
        r, t = self.radius, q.size(2)
        width = 2 * r + 1
        # [N, H, T + 2r, d] -> [N, H, T, d, W]: window w of position i holds key i - r + w
        k_win = F.pad(k, (0, 0, r, r)).unfold(2, width, 1)
        v_win = F.pad(v, (0, 0, r, r)).unfold(2, width, 1)
        scores = torch.einsum("nhtd,nhtdw->nhtw", q, k_win)  # [N, H, T, W]
        offset = torch.arange(width, device=q.device) - r  # key position minus query position
        pos = torch.arange(t, device=q.device).unsqueeze(1) + offset  # [T, W]
        allowed = (pos >= 0) & (pos < t)
        if causal:
            allowed = allowed & (offset <= 0)
        allowed = allowed[None, None]  # [1, 1, T, W]
        if mask is not None:
            padded = F.pad(mask, (r, r), value=False).unfold(1, width, 1)  # [N, T, W]
            allowed = allowed & padded[:, None]
        weights = self.weight_dropout(masked_softmax(scores, allowed))  # [N, H, T, W]
        return torch.einsum("nhtw,nhtdw->nhtd", weights, v_win)

    def _cached(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        """New queries (the last T of L positions) against the keys within r.  -> [N, H, T, d]"""
        t, length = q.size(2), k.size(2)
        first = max(0, length - t - self.radius)
        k, v = k[:, :, first:], v[:, :, first:]  # [N, H, L', d]
        query_pos = torch.arange(length - t, length, device=q.device).unsqueeze(1)  # [T, 1]
        key_pos = torch.arange(first, length, device=q.device).unsqueeze(0)  # [1, L']
        allowed = (key_pos - query_pos).abs() <= self.radius
        if causal:
            allowed = allowed & (key_pos <= query_pos)
        weights = self.weight_dropout(masked_softmax(q @ k.transpose(-1, -2), allowed))  # [N, H, T, L']
        return weights @ v
