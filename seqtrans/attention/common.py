"""Pieces every attention family shares: masked softmax, the self-attention mask, folding
the hypotheses of a sentence onto its source, and reordering decoding state.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T queries this
call, L keys (cached positions included), H heads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.model.masks import additive_mask, causal_mask, key_mask


def masked_softmax(scores: Tensor, allowed: Tensor | None, *, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` where ``allowed`` (broadcastable bool) is True; a row with
    nothing allowed gets all zeros (it attends to nothing) instead of NaN."""
    if allowed is None:
        return scores.softmax(dim)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim)
    return torch.where(allowed.any(dim, keepdim=True), weights, torch.zeros_like(weights))


def self_attention_mask(mask: Tensor | None, *, causal: bool, queries: int, keys: int,
                        device: torch.device) -> Tensor | None:
    """Which keys each query may see: key padding ``mask`` [N, L] and/or causality
    (the queries being the last ``queries`` of ``keys`` positions).  -> [N|1, 1, T, L] or None"""
    allowed = key_mask(mask) if mask is not None else None  # [N, 1, 1, L]
    if causal:
        order = causal_mask(queries, keys, device=device)  # [T, L]
        allowed = order if allowed is None else allowed & order
    return allowed


def fold(x: Tensor, sentences: int) -> Tensor:
    """The hypotheses of each sentence side by side on the query axis, so they share its
    source tensors without copying them.  [N, T, F] -> [B, K*T, F]"""
    n, t, f = x.shape
    return x.reshape(sentences, (n // sentences) * t, f)


def unfold(x: Tensor, rows: int) -> Tensor:
    """Inverse of :func:`fold`.  [B, K*T, F] -> [N, T, F]"""
    b, kt, f = x.shape
    return x.reshape(rows, b * kt // rows, f)


# Decoding state follows the search with reorder(rows, sentences): tensors indexed by
# hypothesis select ``rows``; tensors indexed by sentence select ``sentences`` when some
# sentences finished. States mark each tensor field with one of these.
ROW = {"index": "row"}
SENTENCE = {"index": "sentence"}


def reorder_fields(state: Any, rows: Tensor, sentences: Tensor | None) -> None:
    """Apply a search step's reordering to every marked tensor field of a dataclass state."""
    for f in dataclasses.fields(state):
        kind = f.metadata.get("index")
        value = getattr(state, f.name)
        if value is None or kind is None:
            continue
        if kind == "row":
            setattr(state, f.name, value.index_select(0, rows))
        elif sentences is not None:
            setattr(state, f.name, value.index_select(0, sentences))


def copy_linear(module: nn.Module, weights: dict[str, Tensor], names: dict[str, str]) -> list[str]:
    """Copy ``weights["THEIRS.weight"]`` (and ``.bias``) into ``module``'s ``MINE`` linear
    layer for each ``MINE: THEIRS`` of ``names``, where the shapes agree; the names of the
    parameters set."""
    own = dict(module.named_parameters())
    taken = []
    with torch.no_grad():
        for mine, theirs in names.items():
            for part in ("weight", "bias"):
                source = weights.get(f"{theirs}.{part}")
                target = own.get(f"{mine}.{part}")
                if source is not None and target is not None and source.shape == target.shape:
                    target.copy_(source)
                    taken.append(f"{mine}.{part}")
    return taken


def prefix_lengths(mask: Tensor) -> list[int] | None:
    """How many real tokens each row of a padding ``mask`` [N, T] starts with, or None
    where some row has a padded position before a real one."""
    lengths = mask.sum(1)  # [N]
    prefix = torch.arange(mask.size(1), device=mask.device) < lengths.unsqueeze(1)  # [N, T]
    return lengths.tolist() if torch.equal(prefix, mask) else None


def each_sentence(q: Tensor, k: Tensor, v: Tensor, lengths: list[int], *, causal: bool,
                  scale: float | None = None, bias: Tensor | None = None) -> Tensor:
    """Attention of each sentence over its first ``lengths[i]`` keys, its real queries in
    the call a batch of that sentence alone makes (no mask, so the same bits), its padded
    queries in a call of their own (over the real keys, as a key mask has them).
    Sentences of one length share a call: the kernel computes each (sentence, head) on its
    own, with blocks set by the lengths alone, so the bits are those of a call per sentence
    (tests/decoding/test_batch_invariance.py), at a call per length rather than per sentence.
    ``scale`` multiplies the logits (None: 1/sqrt(d)); ``bias`` [1, H, T, T], the same for
    every sentence (relative positions), is added to them.
    q, k, v [N, H, T, d] -> [N, H, T, d]"""
    out = torch.empty_like(q)
    groups: dict[int, list[int]] = {}
    for i, length in enumerate(lengths):
        groups.setdefault(length, []).append(i)
    for length, rows in groups.items():
        if not length:
            out[rows] = 0.0
            continue
        first, last = rows[0], rows[-1] + 1
        # a run of neighbours (a batch sorted by length) is a view; others are gathered
        index: slice | Tensor = (slice(first, last) if last - first == len(rows)
                                 else torch.tensor(rows, device=q.device))
        kr, vr = k[index, :, :length], v[index, :, :length]
        if bias is None:
            out[index, :, :length] = F.scaled_dot_product_attention(q[index, :, :length], kr, vr,
                                                                    is_causal=causal, scale=scale)
        else:
            real = bias[:, :, :length, :length]  # [1, H, length, length]
            allowed = causal_mask(length, length, device=q.device) if causal else None
            out[index, :, :length] = F.scaled_dot_product_attention(
                q[index, :, :length], kr, vr, attn_mask=additive_mask(real, allowed), scale=scale)
        if length < q.size(2):
            padded = None if bias is None else bias[:, :, length:, :length]  # [1, H, T - length, length]
            out[index, :, length:] = F.scaled_dot_product_attention(q[index, :, length:], kr, vr,
                                                                    attn_mask=padded, scale=scale)
    return out
