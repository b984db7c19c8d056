"""Source-target word alignments from encoder-decoder attention: pure functions from the
weights of a teacher-forced pass (:func:`seqtrans.model.transformer.attention_maps`) to
Pharaoh ``i-j`` pairs of word indices.

Each target token is aligned to the source token it attends to most (heads averaged,
one layer or the mean of all layers), the end symbols excluded on both sides; token
pairs become word pairs through each token's word index.

Shapes: B sentences, H heads, T target tokens (the end symbol last), S source tokens
(the end symbol last), M memory slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from seqtrans.attention.maps import CrossWeights, HeadMonotonicWeights, MemoryWeights, MonotonicWeights
from seqtrans.errors import UsageError


def source_weights(weights: CrossWeights) -> Tensor:
    """One layer's encoder-decoder weights as a distribution over source positions per
    target step: heads averaged; memory attention through its contexts (beta alpha^T);
    monotonic attention's expected alignment; monotonic multihead attention's expected
    attention, heads averaged.  -> [B, T, S]"""
    if isinstance(weights, MemoryWeights):
        return weights.contexts @ weights.source  # [B, T, M] @ [B, M, S] -> [B, T, S]
    if isinstance(weights, MonotonicWeights):
        return weights.expected
    if isinstance(weights, HeadMonotonicWeights):
        return weights.attention.float().mean(dim=1)  # [B, H, T, S] -> [B, T, S]
    return weights.float().mean(dim=1)  # [B, H, T, S] -> [B, T, S]


def layer_weights(cross: Sequence[CrossWeights], *, layer: int | None) -> Tensor:
    """The weights of decoder layer ``layer`` (counted from 1), or their mean over all
    layers for None.  -> [B, T, S]"""
    if layer is None:
        stacked = torch.stack([source_weights(w).float() for w in cross])  # [L, B, T, S]
        return stacked.mean(dim=0)  # [B, T, S]
    if not 1 <= layer <= len(cross):
        raise UsageError(f"alignment layer {layer}: the model has decoder layers 1 to {len(cross)}")
    return source_weights(cross[layer - 1]).float()


def word_alignment(weights: Tensor, *, source_words: Sequence[int],
                   target_words: Sequence[int]) -> list[tuple[int, int]]:
    """Word pairs (source word, target word), sorted and without repeats: each target
    token (but the last, the end symbol) with the source token (but the last, the end
    symbol) of highest weight, mapped to words by ``source_words`` and ``target_words``
    (the word index of each token, end symbols excluded).

    weights [T, S] -> pairs
    """
    t, s = len(target_words), len(source_words)
    if t == 0 or s == 0:
        return []
    best = weights[:t, :s].argmax(dim=1).tolist()  # [T'] source token of each target token
    return sorted({(source_words[j], target_words[i]) for i, j in enumerate(best)})


def pharaoh(pairs: Sequence[tuple[int, int]]) -> str:
    """``i-j`` pairs separated by spaces (source word i, target word j, from 0)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
