"""Additive attention, Bahdanau et al. (2015), "Neural Machine Translation by Jointly
Learning to Align and Translate", appendix A.1.2: e(s, h) = v^T tanh(W s + U h).

Multi-head: each head has its own v_i and the i-th slices of W s and U h, so one head is
the paper's formula (written ``v^T tanh(W [s; h])`` with W = [W U]). ``U h`` (with the
bias) is computed once per attended sequence. Scores materialise a [B, H, Q, S, d]
tensor: the price of the tanh between query and key. Used through
:mod:`seqtrans.attention.content`.

Shapes: B batch, Q queries, S attended positions, H heads, D model, d = D/H.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqtrans.attention.scaled_dot import split_heads


class AdditiveScore(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(d_model, d_model, bias=False)  # W
        self.key = nn.Linear(d_model, d_model)  # U, with the bias
        head_dim = d_model // heads
        self.v = nn.Parameter(torch.empty(heads, head_dim))
        nn.init.xavier_uniform_(self.query.weight)
        nn.init.xavier_uniform_(self.key.weight)
        nn.init.zeros_(self.key.bias)
        nn.init.uniform_(self.v, -1 / math.sqrt(head_dim), 1 / math.sqrt(head_dim))

    def keys(self, states: Tensor) -> Tensor:
        return split_heads(self.key(states), self.heads)  # [B, H, S, d]

    def scores(self, x: Tensor, keys: Tensor) -> Tensor:
        q = split_heads(self.query(x), self.heads)  # [B, H, Q, d]
        hidden = torch.tanh(q.unsqueeze(3) + keys.unsqueeze(2))  # [B, H, Q, S, d]
        return torch.einsum("bhqsd,hd->bhqs", hidden, self.v)  # [B, H, Q, S]
