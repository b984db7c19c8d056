"""Local attention, Luong et al. (2015), section 3.2: attend within a window
[p_t - D, p_t + D] of source positions around an aligned position p_t.

- local-m (``alignment="monotonic"``): p_t = t, the target position.
- local-p (``alignment="predictive"``): p_t = S * sigmoid(v_p^T tanh(W_p h_t)), with S the
  source's length, and the weights are multiplied by a Gaussian centred at p_t,
  a_t(s) = align(h_t, h_s) * exp(-(s - p_t)^2 / (2 sigma^2)), sigma = D / 2.

align() is a softmax over the window of the ``general`` score (the paper's best local
model). Multi-head: each head has its own query slice, keys and (local-p) aligned
position. A window that holds no source position (local-m past the source's end)
attends to nothing. Scores are computed for all positions and masked to the window:
the mechanism changes what is attended, not the work done.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T queries this
call, H heads, D model, d = D/H.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqtrans.attention.common import SENTENCE, fold, masked_softmax, reorder_fields, unfold
from seqtrans.attention.luong import GeneralScore
from seqtrans.attention.scaled_dot import merge_heads, split_heads
from seqtrans.model.dropout import Dropout


@dataclass
class LocalState:
    """A source's keys, values and length, and how many target positions came before."""

    keys: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]
    values: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]
    mask: Tensor = field(metadata=SENTENCE)  # [B, S], True at real tokens
    offset: int = 0  # target positions already decoded (local-m's t)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class LocalAttention(nn.Module):
    """``prepare(memory [B, S, D], mask [B, S]) -> LocalState``;
    ``forward(x [N, T, D], state) -> [N, T, D]``."""

    def __init__(self, d_model: int, heads: int, *, window: int, alignment: str,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if alignment not in ("predictive", "monotonic"):
            raise ValueError(f"alignment must be 'predictive' or 'monotonic', got {alignment!r}")
        self.heads = heads
        self.window = window
        self.predictive = alignment == "predictive"
        self.score = GeneralScore(d_model, heads)
        if self.predictive:
            self.w_p = nn.Linear(d_model, d_model, bias=False)
            self.v_p = nn.Linear(d_model, heads, bias=False)  # one v_p per head
            nn.init.xavier_uniform_(self.w_p.weight)
            nn.init.xavier_uniform_(self.v_p.weight)
        self.dropout = Dropout(dropout)
        self.out = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def prepare(self, memory: Tensor, mask: Tensor) -> LocalState:
        return LocalState(self.score.keys(memory), split_heads(memory, self.heads), mask)

    def forward(self, x: Tensor, state: LocalState) -> Tensor:
        n, t, _ = x.shape
        weights = self._weights(fold(x, state.mask.size(0)), state, t)  # [B, H, K*T, S]
        state.offset += t
        context = merge_heads(self.dropout(weights) @ state.values)  # [B, K*T, D]
        return self.out(unfold(context, n))  # [N, T, D]

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, D], memory [B, S, D], mask [B, S] -> [B, H, T, S]"""
        return self._weights(x, self.prepare(memory, mask), x.size(1))

    def _weights(self, q: Tensor, state: LocalState, t: int) -> Tensor:
        """The weights of K hypotheses' T new queries each, folded.  q [B, K*T, D] -> [B, H, K*T, S]"""
        b, s = state.mask.shape
        scores = self.score.scores(q, state.keys)  # [B, H, K*T, S]
        if self.predictive:
            length = state.mask.sum(1).to(q.dtype)  # [B]
            gate = torch.sigmoid(self.v_p(torch.tanh(self.w_p(q))))  # [B, K*T, H]
            aligned = length[:, None, None] * gate.transpose(1, 2)  # [B, H, K*T]
        else:
            target_pos = torch.arange(state.offset, state.offset + t, device=q.device, dtype=q.dtype)
            aligned = target_pos.repeat(q.size(1) // t if t else 1)[None, None]  # [1, 1, K*T]
        source_pos = torch.arange(s, device=q.device, dtype=q.dtype)
        distance = source_pos - aligned.unsqueeze(-1)  # [B|1, H|1, K*T, S]
        allowed = (distance.abs() <= self.window) & state.mask[:, None, None, :]
        weights = masked_softmax(scores, allowed)  # [B, H, K*T, S]
        if self.predictive:
            sigma = self.window / 2
            weights = weights * torch.exp(-distance.square() / (2 * sigma**2))
        return weights
