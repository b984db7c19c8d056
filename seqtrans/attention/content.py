"""Multi-head attention around any score function (Luong's and Bahdanau's families).

A score function maps the queries' inputs and the keys to one score per head, query
and key; the weights are a softmax over the keys, the values are the attended states
themselves, split into heads, and one output projection mixes the heads (the role of
Luong's W_c and of the Transformer's W^O). So with one head and score ``dot`` this is
exactly Luong et al.'s global attention, ``c = sum_s softmax(h_t^T h_s) h_s``.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T queries,
L keys (cached ones included), H heads, D model, d = D/H.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor, nn

from seqtrans.attention.cache import KVCache
from seqtrans.attention.common import (
    SENTENCE,
    fold,
    masked_softmax,
    reorder_fields,
    self_attention_mask,
    unfold,
)
from seqtrans.attention.scaled_dot import merge_heads, split_heads
from seqtrans.model.dropout import Dropout
from seqtrans.model.masks import key_mask


class Score(Protocol):
    """A score function: ``keys`` once per attended sequence (what a cache stores),
    ``scores`` for each batch of queries."""

    heads: int

    def keys(self, states: Tensor) -> Tensor:
        """[B, S, D] -> [B, H, S, d]"""
        ...

    def scores(self, x: Tensor, keys: Tensor) -> Tensor:
        """queries' inputs x [B, Q, D], keys [B, H, S, d] -> [B, H, Q, S]"""
        ...


def _projection(lin: nn.Linear) -> nn.Linear:
    nn.init.xavier_uniform_(lin.weight)
    if lin.bias is not None:
        nn.init.zeros_(lin.bias)
    return lin


class _ScoredHeads(nn.Module):
    """What attention with a score function holds at either site: the score function,
    dropout on the weights and the output projection that mixes the heads."""

    def __init__(self, score: Score, d_model: int, *, dropout: float = 0.0) -> None:
        super().__init__()
        self.score = score
        self.heads = score.heads
        self.dropout = Dropout(dropout)
        self.out = _projection(nn.Linear(d_model, d_model))


class ContentSelfAttention(_ScoredHeads):
    """Self-attention with a score function.

    ``forward(x [N, T, D], mask=[N, T] | None, causal=bool, cache=KVCache | None) -> [N, T, D]``
    """

    def new_cache(self, rows: int, capacity: int, *, like: Tensor) -> KVCache:
        d = self.out.in_features // self.heads
        return KVCache(rows, self.heads, d, capacity, dtype=like.dtype, device=like.device)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None, position_bias: Tensor | None = None) -> Tensor:
        if position_bias is not None:
            raise ValueError("attention with a score function takes no position bias "
                             "(model.positions=relative)")
        keys = self.score.keys(x)  # [N, H, T, d]
        values = split_heads(x, self.heads)  # [N, H, T, d]
        if cache is not None:
            if mask is not None:
                raise ValueError("a key padding mask cannot be combined with a cache")
            keys, values = cache.append(keys, values)  # [N, H, L, d]
        allowed = self_attention_mask(mask, causal=causal, queries=x.size(1), keys=keys.size(2),
                                      device=x.device)
        weights = masked_softmax(self.score.scores(x, keys), allowed)  # [N, H, T, L]
        return self.out(merge_heads(self.dropout(weights) @ values))

    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """x [N, T, D] -> [N, H, T, T]"""
        allowed = self_attention_mask(mask, causal=causal, queries=x.size(1), keys=x.size(1),
                                      device=x.device)
        return masked_softmax(self.score.scores(x, self.score.keys(x)), allowed)


@dataclass
class ContentState:
    """Keys and values of one source, computed once (per sentence, shared by its hypotheses)."""

    keys: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]
    values: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]
    mask: Tensor = field(metadata=SENTENCE)  # [B, 1, 1, S], True at real tokens

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class ContentCrossAttention(_ScoredHeads):
    """Encoder-decoder attention with a score function.

    ``prepare(memory [B, S, D], mask [B, S]) -> ContentState``;
    ``forward(x [N, T, D], state) -> [N, T, D]`` with N a multiple of B.
    """

    def prepare(self, memory: Tensor, mask: Tensor) -> ContentState:
        return ContentState(self.score.keys(memory), split_heads(memory, self.heads), key_mask(mask))

    def forward(self, x: Tensor, state: ContentState) -> Tensor:
        b = state.keys.size(0)
        q = fold(x, b)  # [B, K*T, D]
        weights = masked_softmax(self.score.scores(q, state.keys), state.mask)  # [B, H, K*T, S]
        context = merge_heads(self.dropout(weights) @ state.values)  # [B, K*T, D]
        return self.out(unfold(context, x.size(0)))  # [N, T, D]

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, D], memory [B, S, D], mask [B, S] -> [B, H, T, S]"""
        return masked_softmax(self.score.scores(x, self.score.keys(memory)), key_mask(mask))
