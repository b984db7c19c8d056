"""Memory attention, Britz et al. (2017), "Efficient Attention using a Fixed-Size Memory
Representation", section 3.

While encoding, K attention contexts are computed once per source:

    alpha = score(W_alpha s_t)          [S, K], normalised over source positions t
    C_k   = sum_t alpha_tk s_t          [K, D]

and each decoder step mixes them with weights from the decoder state alone:

    beta  = score(W_beta h)             [K], normalised over the K contexts
    c     = sum_k beta_k C_k            [D]

``score`` is a softmax or an element-wise sigmoid, chosen on each side. In the paper
beta depends on the decoder state alone, not on what the contexts hold; ``content``
(not in the paper) scores each context by its content instead, as Luna's "unpack"
attention reads its packed memory (Ma et al. 2021):

    beta  = softmax_k((W_q h) . (W_k C_k) / sqrt(D))

still O(K*D) per step, the keys W_k C_k made once per source. With H > 1 heads (content
scores only) each head scores the contexts with its own slice of the query and key
projections and mixes its own values, as multi-head attention does over source positions:

    beta_h = softmax_k((W_q h)_h . (W_k C_k)_h / sqrt(D/H))
    c      = W_o concat_h(sum_k beta_hk (W_v C_k)_h)

O(H*K*D) per step: each head's values go through its slice of W_o once per source, so the
step is one product of the H*K weights with the H*K projected contexts. The optional
position encodings L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S) (s, k counted from 1, S the
source's own length) multiply the encoder scores before the score function; padded
positions are masked out, so a softmax renormalises over the real ones. Those encodings
are smooth: each favours the start or the end of the source, none a position in between.
A local prior (not in the paper) adds to each score the log of a Gaussian around the
slot's own point of the source,

    - ((s - 1/2)/S - (k - 1/2)/K)^2 / (2 sigma^2),   sigma = width / K,

so that with K at least the source's length each position can have contexts of its own
and the memory loses little; with fewer slots they tile the source.

The decoder step reads only C: decoding costs O(K*D) per step, O(K*D*(|S| + |T|)) in
all, against O(D*|S|) per step for attention over the encoder states. The output
projection is applied to C once per source (W_o c = sum_k beta_k W_o C_k), which moves
its cost out of the decoding loop too.

Single-head by default, as in the paper: the K contexts already play the part of heads,
each an attention over the source, and beta mixes them.

Shapes: B sentences, K hypotheses per sentence (beam), N = B*K rows, S source, T
target positions this call, M memory slots (the paper's K), D model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from seqtrans.attention.common import SENTENCE, fold, masked_softmax, reorder_fields, unfold
from seqtrans.attention.maps import MemoryWeights


def position_encodings(mask: Tensor, slots: int) -> Tensor:
    """L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S) with S each source's length; zero at padding.

    mask [B, S] (True at real tokens) -> [B, S, M]
    """
    length = mask.sum(1, keepdim=True).to(torch.float32)  # [B, 1]
    s = torch.arange(1, mask.size(1) + 1, device=mask.device, dtype=torch.float32) / length  # [B, S]
    k = torch.arange(1, slots + 1, device=mask.device, dtype=torch.float32) / slots  # [M]
    s, k = s.unsqueeze(-1), k[None, None]  # [B, S, 1], [1, 1, M]
    return ((1 - k) * (1 - s) + k * s) * mask.unsqueeze(-1)


def local_prior(mask: Tensor, slots: int, width: float) -> Tensor:
    """-((s - 1/2)/S - (k - 1/2)/K)^2 / (2 (width/K)^2) with S each source's length.

    mask [B, S] (True at real tokens) -> [B, S, M]
    """
    length = mask.sum(1, keepdim=True).clamp(min=1).to(torch.float32)  # [B, 1]
    s = (torch.arange(mask.size(1), device=mask.device, dtype=torch.float32) + 0.5) / length  # [B, S]
    k = (torch.arange(slots, device=mask.device, dtype=torch.float32) + 0.5) / slots  # [M]
    sigma = width / slots
    return -(s.unsqueeze(-1) - k[None, None]) ** 2 / (2 * sigma**2)


@dataclass
class MemoryState:
    """Everything the decoder reads: the K contexts of each source, already through W_o.

    Nothing of length S is kept, so decoding cannot touch the encoder states.
    """

    contexts: Tensor = field(metadata=SENTENCE)  # [B, H*M, D]: W_o C_k (no bias), per head with H > 1
    keys: Tensor | None = field(default=None, metadata=SENTENCE)  # [B, M, D]: W_k C_k (content scores)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class MemoryAttention(nn.Module):
    """``prepare(memory [B, S, D], mask [B, S]) -> MemoryState``;
    ``forward(x [N, T, D], state) -> [N, T, D]``."""

    def __init__(self, d_model: int, *, slots: int, encoder_score: str = "softmax",
                 decoder_score: str = "softmax", positions: bool = False, heads: int = 1,
                 local_width: float = 0.0) -> None:
        super().__init__()
        if encoder_score not in ("softmax", "sigmoid"):
            raise ValueError(f"encoder score must be 'softmax' or 'sigmoid', got {encoder_score!r}")
        if decoder_score not in ("softmax", "sigmoid", "content"):
            raise ValueError(f"decoder score must be 'softmax', 'sigmoid' or 'content', "
                             f"got {decoder_score!r}")
        if heads < 1 or d_model % heads or (heads > 1 and decoder_score != "content"):
            raise ValueError(f"memory heads must divide d_model ({d_model}) and need content scores, "
                             f"got {heads} with {decoder_score!r}")
        self.slots = slots
        self.heads = heads
        self.encoder_score = encoder_score
        self.decoder_score = decoder_score
        self.positions = positions
        self.local_width = local_width
        self.w_alpha = nn.Linear(d_model, slots, bias=False)
        self.w_beta = nn.Linear(d_model, slots, bias=False)
        content = decoder_score == "content"
        self.w_q = nn.Linear(d_model, d_model, bias=False) if content else None
        self.w_k = nn.Linear(d_model, d_model, bias=False) if content else None
        # one head's values are the contexts themselves (W_o reads them); several need their own
        self.w_v = nn.Linear(d_model, d_model, bias=False) if heads > 1 else None
        self.out = nn.Linear(d_model, d_model)
        bound = 1 / math.sqrt(d_model)
        for lin in (self.w_alpha, self.w_beta):
            nn.init.uniform_(lin.weight, -bound, bound)
        for projection in (self.w_q, self.w_k, self.w_v):
            if projection is not None:
                nn.init.xavier_uniform_(projection.weight)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def encoder_weights(self, memory: Tensor, mask: Tensor) -> Tensor:
        """alpha.  memory [B, S, D], mask [B, S] -> [B, S, M]"""
        scores = self.w_alpha(memory)  # [B, S, M]
        if self.positions:
            scores = scores * position_encodings(mask, self.slots).to(scores.dtype)
        if self.local_width:
            scores = scores + local_prior(mask, self.slots, self.local_width).to(scores.dtype)
        keep = mask.unsqueeze(-1)  # [B, S, 1]
        if self.encoder_score == "softmax":
            return masked_softmax(scores, keep, dim=1)
        return torch.sigmoid(scores) * keep

    def prepare(self, memory: Tensor, mask: Tensor) -> MemoryState:
        alpha = self.encoder_weights(memory, mask)  # [B, S, M]
        contexts = alpha.transpose(1, 2) @ memory  # [B, M, D]: C_k = sum_t alpha_tk s_t
        keys = self.w_k(contexts) if self.w_k is not None else None  # [B, M, D]: W_k C_k
        if self.w_v is None:
            return MemoryState(contexts @ self.out.weight.t(), keys)  # [B, M, D]: W_o C_k
        b, m, d = contexts.shape
        values = self.w_v(contexts).view(b, m, self.heads, d // self.heads).transpose(1, 2)  # [B, H, M, D/H]
        w_o = self.out.weight.view(d, self.heads, d // self.heads).permute(1, 2, 0)  # [H, D/H, D]
        return MemoryState((values @ w_o).reshape(b, self.heads * m, d), keys)  # [B, H*M, D]

    def decoder_weights(self, x: Tensor, keys: Tensor | None = None) -> Tensor:
        """beta, head after head; ``keys`` [B, M, D] (W_k C_k) for content scores.
        x [N, T, D] -> [N, T, H*M]"""
        if self.decoder_score == "content":
            assert self.w_q is not None and keys is not None
            b, m, d = keys.shape
            query = fold(self.w_q(x), b)  # [B, K*T, D]
            per_head = d // self.heads
            query = query.view(b, -1, self.heads, per_head).transpose(1, 2)  # [B, H, K*T, D/H]
            keys = keys.view(b, m, self.heads, per_head).transpose(1, 2)  # [B, H, M, D/H]
            beta = (query @ keys.transpose(2, 3) * per_head**-0.5).softmax(-1)  # [B, H, K*T, M]
            return unfold(beta.transpose(1, 2).reshape(b, -1, self.heads * m), x.size(0))  # [N, T, H*M]
        scores = self.w_beta(x)
        return scores.softmax(-1) if self.decoder_score == "softmax" else torch.sigmoid(scores)

    def forward(self, x: Tensor, state: MemoryState) -> Tensor:
        b = state.contexts.size(0)
        beta = fold(self.decoder_weights(x, state.keys), b)  # [B, K*T, M]
        out = beta @ state.contexts + self.out.bias  # [B, K*T, D]
        return unfold(out, x.size(0))  # [N, T, D]

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> MemoryWeights:
        """beta over the contexts and alpha over the source.  x [B, T, D], memory [B, S, D], mask [B, S]"""
        alpha = self.encoder_weights(memory, mask)  # [B, S, M]
        keys = self.w_k(alpha.transpose(1, 2) @ memory) if self.w_k is not None else None  # [B, M, D]
        beta = self.decoder_weights(x, keys)  # [B, T, H*M]
        beta = beta.view(*beta.shape[:2], self.heads, self.slots).mean(2)  # the heads' mean
        return MemoryWeights(beta, alpha.transpose(1, 2))
