"""Luong et al. (2015), "Effective Approaches to Attention-based Neural Machine
Translation", section 3.1: the ``dot``, ``general`` and ``location`` score functions.

- dot:      score(h_t, h_s) = h_t^T h_s
- general:  score(h_t, h_s) = h_t^T W_a h_s
- location: a_t = softmax(W_a h_t), one score per source position, no content.

Multi-head: head i scores with the i-th slice of the query (and of ``W_a h_s``), so one
head is the paper's formula exactly and the heads together sum to it. As in the paper,
scores are not scaled by 1/sqrt(d) (Vaswani et al. added that), and the values are the
attended states themselves. Used through :mod:`seqtrans.attention.content`.

Shapes: B batch, Q queries, S attended positions, H heads, D model, d = D/H.
"""

from __future__ import annotations

from torch import Tensor, nn

from seqtrans.attention.scaled_dot import split_heads


class DotScore(nn.Module):
    """h_t^T h_s per head; no parameters."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def keys(self, states: Tensor) -> Tensor:
        return split_heads(states, self.heads)  # [B, H, S, d]

    def scores(self, x: Tensor, keys: Tensor) -> Tensor:
        return split_heads(x, self.heads) @ keys.transpose(-1, -2)  # [B, H, Q, S]


class GeneralScore(nn.Module):
    """h_t^T W_a h_s per head (the keys are W_a h_s, computed once per attended sequence)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.w = nn.Linear(d_model, d_model, bias=False)
        nn.init.xavier_uniform_(self.w.weight)

    def keys(self, states: Tensor) -> Tensor:
        return split_heads(self.w(states), self.heads)  # [B, H, S, d]

    def scores(self, x: Tensor, keys: Tensor) -> Tensor:
        return split_heads(x, self.heads) @ keys.transpose(-1, -2)  # [B, H, Q, S]


class LocationScore(nn.Module):
    """(W_a h_t)_s: a score per head and position up to ``max_length``, from the query alone."""

    def __init__(self, d_model: int, heads: int, *, max_length: int) -> None:
        super().__init__()
        self.heads = heads
        self.max_length = max_length
        self.w = nn.Linear(d_model, heads * max_length, bias=False)
        nn.init.xavier_uniform_(self.w.weight)

    def keys(self, states: Tensor) -> Tensor:
        # nothing is scored against the keys; the cache still needs a tensor per position
        return split_heads(states, self.heads)  # [B, H, S, d]

    def scores(self, x: Tensor, keys: Tensor) -> Tensor:
        b, q, _ = x.shape
        length = keys.size(2)
        if length > self.max_length:
            raise ValueError(
                f"location attention over {length} positions, beyond model.location_max_length="
                f"{self.max_length}"
            )
        scores = self.w(x).view(b, q, self.heads, self.max_length)  # [B, Q, H, L_max]
        return scores.permute(0, 2, 1, 3)[..., :length]  # [B, H, Q, S]
