"""Relative position biases (``model.positions=relative``; Raffel et al. 2020, section
2.1, a simpler form of Shaw et al. 2018's): no position is added to the embeddings;
instead each self-attention layer adds to its logits a learned scalar per head and
bucket of the distance from the query to the key. A stack has one table; it computes
the bias once for a call and every layer adds the same.

Distances are bucketed: small ones exactly, larger ones on a log scale up to a maximum
distance, beyond which all share the last bucket. The encoder's buckets are
bidirectional (half for keys before the query, half for keys after it); the decoder's
cover past positions only (a later key is masked anyway).

Shapes: H heads, T queries (this call), L keys (cached positions included).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def relative_buckets(relative: Tensor, *, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """The bucket of each relative position (key position minus query position), as
    Raffel et al.'s Mesh TensorFlow code computes it, in float32 as it does, so that
    distances near a bucket's edge fall on the same side.  relative [...] (int64) -> [...] (int64)"""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out = out + (relative > 0).long() * buckets  # keys after the query in the upper half
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # a key after the query counts as distance 0
    exact = buckets // 2
    # the other half: log-spaced from `exact` up to max_distance
    scaled = (torch.log(distance.float() / exact) / math.log(max_distance / exact) * (buckets - exact)).long()
    large = torch.clamp(exact + scaled, max=buckets - 1)
    return out + torch.where(distance < exact, distance, large)


class RelativePositionBias(nn.Module):
    """A stack's learned bias per bucket and head.

    ``forward(queries, keys, offset=...) -> [1, H, T, L]`` for queries at positions
    ``offset`` .. ``offset + T - 1`` and keys at 0 .. L - 1; the same for every sentence."""

    def __init__(self, heads: int, *, buckets: int, max_distance: int, bidirectional: bool,
                 d_model: int) -> None:
        super().__init__()
        self.buckets = buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.table = nn.Embedding(buckets, heads)  # [buckets, H]
        nn.init.normal_(self.table.weight, std=d_model**-0.5)
        # (the table's identity, the bias by distance [H, D]) kept for decoding steps (_step)
        self._by_distance: tuple[tuple[object, ...], Tensor] | None = None

    def forward(self, queries: int, keys: int, *, offset: int = 0) -> Tensor:
        weight = self.table.weight
        # (a table made under inference_mode keeps no version to tell a change by: made anew)
        if (queries == 1 and keys <= offset + 1 and not self.bidirectional and not weight.is_inference()
                and not (torch.is_grad_enabled() and weight.requires_grad)):
            return self._step(keys, offset)
        device = weight.device
        query = torch.arange(offset, offset + queries, device=device)  # [T]
        key = torch.arange(keys, device=device)  # [L]
        bucket = relative_buckets(key[None, :] - query[:, None], bidirectional=self.bidirectional,
                                  buckets=self.buckets, max_distance=self.max_distance)  # [T, L]
        return self.table(bucket).permute(2, 0, 1).unsqueeze(0)  # [T, L, H] -> [1, H, T, L]

    def _step(self, keys: int, offset: int) -> Tensor:
        """A decoder step's bias, one query at ``offset`` over keys 0 .. ``keys`` - 1 (none
        after it): a slice of the bias by distance, made once and kept while the table is
        unchanged, instead of the buckets' dozen operators at every step; the same values.
        -> [1, H, 1, L]"""
        weight = self.table.weight
        identity = (weight.data_ptr(), weight._version, weight.device, weight.dtype)
        kept = self._by_distance
        if kept is None or kept[0] != identity or kept[1].size(1) <= offset:
            size = 64 if kept is None else kept[1].size(1)
            if size <= offset:
                size = max(offset + 1, 2 * size)  # doubled: a longer decode grows it a few times only
            # column c is the key at distance size - 1 - c before the query
            distance = torch.arange(size - 1, -1, -1, device=weight.device)  # [D]
            bucket = relative_buckets(-distance, bidirectional=False, buckets=self.buckets,
                                      max_distance=self.max_distance)  # [D]
            kept = self._by_distance = (identity, self.table(bucket).t().contiguous())  # [H, D]
        start = kept[1].size(1) - 1 - offset  # the key at position 0
        return kept[1][:, start:start + keys].unsqueeze(0).unsqueeze(2)  # [1, H, 1, L]

    def extra_repr(self) -> str:
        return (f"buckets={self.buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional}")
