"""Monotonic infinite lookback attention (MILk), Arivazhagan et al. (2019), "Monotonic
Infinite Lookback Attention for Simultaneous Machine Translation".

A monotonic head (Raffel et al. 2017, :mod:`seqtrans.attention.monotonic`) decides how
far into the source each output step reads: step i stops at the first position t_i from
t_{i-1} on that it selects. A soft multi-head attention then attends over everything
read so far, positions 0..t_i. Hard monotonic attention alone sees one source state per
step and is known to lose quality on translation; the lookback keeps the policy's
read/write decisions and restores attention over the whole prefix.

Training uses the expected alignment alpha of the monotonic head (eq. 9-14 of Raffel et
al., in log space as in :func:`~seqtrans.attention.monotonic.expected_alignment`) and the
expected soft attention of MILk (eq. 7),

    beta_ij = sum_{k>=j} alpha_ik exp(u_ij) / sum_{l<=k} exp(u_il),

computed for every head in log space: log beta_ij = u_ij + log sum_{k>=j} exp(log alpha_ik
- logcumsumexp(u_i)_k), a reverse log-cumulative-sum. The mass the monotonic head leaves
unselected (it stopped nowhere) goes to the last source position, the end symbol, where
test-time decoding attends over the whole source: the probabilities stay a
distribution and training sees what decoding does ("mass preservation").

The expected delay of step i is sum_j alpha_ij min(j + 1, |x|) source tokens read; the
training loss adds a multiple of its differentiable average lagging
(``train.latency_weight``, :func:`seqtrans.training.loss.expected_lagging`), the knob
that trades quality for latency. At test time (``eval()``) the decisions are hard and
the source is read only as far as they need, so ``predict --stream`` follows a source
as it arrives.

Monotonic chunkwise attention (MoChA, Chiu and Raffel 2018, "Monotonic Chunkwise
Attention") is the same with a soft chunk of w positions ending at t_i in place of the
whole prefix (``chunk=w``); MILk is its limit w = infinity (``chunk=None``). Its expected
attention is

    beta_ij = sum_{k=j}^{j+w-1} alpha_ik exp(u_ij) / sum_{l=k-w+1}^{k} exp(u_il),

both sums moving sums of width w, each taken as a logsumexp over its own window (the
appendix's "subtract the max", with each window's max rather than the row's, so that no
window underflows). The paper's chunk energy is additive with one head; here it is the H
scaled dot-product heads of the lookback (with ``model.heads=1``, one head). Where
the paper gives a step that selects nothing a zero context, the unselected mass goes to
the end symbol as for MILk above, so such a step attends to the source's last w positions.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T target
positions this call, H heads, D model, d = D/H, w chunk width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.common import SENTENCE, copy_linear, fold, unfold
from seqtrans.attention.monotonic import (
    MonotonicAttention,
    MonotonicState,
    SourceStream,
    expected_alignment,
    expected_delays,
)
from seqtrans.attention.scaled_dot import merge_heads, split_heads

# the soft scores at padding: finite, so that the log-space sums have finite gradients
MASKED = -1e4


@dataclass
class LookbackState(MonotonicState):
    """The monotonic head's state and the soft heads' keys and values of the source."""

    soft_k: Tensor | None = field(default=None, metadata=SENTENCE)  # [B, H, S, d]
    soft_v: Tensor | None = field(default=None, metadata=SENTENCE)  # [B, H, S, d]


def preserve_mass(alpha: Tensor, lengths: Tensor) -> Tensor:
    """Give the probability of selecting nothing to each row's last position.
    alpha [R, S], lengths [R] (>= 1) -> [R, S]"""
    rest = (1 - alpha.sum(-1, keepdim=True)).clamp(min=0)  # [R, 1]
    return alpha.scatter_add(-1, (lengths - 1).unsqueeze(1), rest)


def moving_logsumexp(x: Tensor, *, before: int, after: int) -> Tensor:
    """log sum_{l=j-before}^{j+after} exp(x_l) over the last axis, positions past either end
    left out; each window is a logsumexp of its own, so none underflows.  [..., S] -> [..., S]"""
    padded = F.pad(x, (before, after), value=float("-inf"))  # [..., before + S + after]
    return torch.logsumexp(padded.unfold(-1, before + after + 1, 1), dim=-1)  # windows [..., S, w]


def lookback_weights(alpha: Tensor, scores: Tensor, mask: Tensor, *, chunk: int | None = None) -> Tensor:
    """The expected soft attention beta from the monotonic alignment and the soft scores:
    MILk's over the whole prefix (``chunk`` None), MoChA's over a chunk of ``chunk`` positions.
    alpha [N, T, S], scores [N, H, T, S], mask [N, S] -> [N, H, T, S]"""
    keep = mask[:, None, None, :]
    u = scores.to(torch.promote_types(scores.dtype, torch.float32)).masked_fill(~keep, MASKED)
    log_alpha = torch.log(alpha.clamp(min=1e-30)).unsqueeze(1)  # [N, 1, T, S]
    if chunk is None:
        terms = log_alpha - torch.logcumsumexp(u, dim=-1)
        tail = torch.logcumsumexp(terms.flip(-1), dim=-1).flip(-1)  # sum over k >= j
    else:
        width = min(chunk, u.size(-1)) - 1  # a window past both ends is the whole row
        terms = log_alpha - moving_logsumexp(u, before=width, after=0)  # over l in k-w+1..k
        tail = moving_logsumexp(terms, before=0, after=width)  # over k in j..j+w-1
    return torch.exp(u + tail) * keep


class LookbackAttention(MonotonicAttention):
    """``prepare(memory [B, S, D], mask [B, S]) -> LookbackState``;
    ``forward(x [N, T, D], state) -> [N, T, D]``: expected attention in training
    (recording the expected delays for the latency loss), hard decisions in ``eval()``.
    ``chunk``: MoChA's chunk width w; None looks back over everything read (MILk)."""

    def __init__(self, d_model: int, heads: int, *, chunk: int | None = None, dim: int = 0,
                 noise: float = 1.0, r_init: float = -4.0, temperature: float = 1.0,
                 dropout: float = 0.0) -> None:
        super().__init__(d_model, dim=dim, noise=noise, r_init=r_init, temperature=temperature)
        if chunk is not None and chunk < 1:
            raise ValueError(f"a chunk holds at least one position, got {chunk}")
        self.heads = heads
        self.chunk = chunk
        self.dropout = dropout
        self.soft_q = nn.Linear(d_model, d_model)
        self.soft_kv = nn.Linear(d_model, 2 * d_model)
        for lin in (self.soft_q, self.soft_kv):
            nn.init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2))
            nn.init.zeros_(lin.bias)

    def _soft(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.soft_kv(memory).chunk(2, dim=-1)  # 2 x [B, S, D]
        return split_heads(k, self.heads), split_heads(v, self.heads)

    def prepare(self, memory: Tensor, mask: Tensor) -> LookbackState:
        soft_k, soft_v = self._soft(memory)
        return LookbackState(self.key(memory), memory, mask, mask.sum(1), soft_k=soft_k, soft_v=soft_v)

    def follow(self, source: SourceStream, *, like: Tensor) -> LookbackState:
        base = super().follow(source, like=like)
        empty = like.new_zeros(1, self.heads, 0, self.out.in_features // self.heads)
        return LookbackState(base.keys, base.values, base.mask, base.lengths, source=source,
                             soft_k=empty, soft_v=empty)

    def extend(self, state: MonotonicState, memory: Tensor) -> None:
        super().extend(state, memory)
        assert isinstance(state, LookbackState) and state.soft_k is not None and state.soft_v is not None
        soft_k, soft_v = self._soft(memory)
        state.soft_k = torch.cat([state.soft_k, soft_k], dim=2)
        state.soft_v = torch.cat([state.soft_v, soft_v], dim=2)

    def adopt(self, weights: dict[str, Tensor]) -> list[str]:
        """Start from a scaled-dot encoder-decoder attention: its query, key and value
        projections become the soft heads', its output projection this one's; the
        monotonic head, the read policy, starts new."""
        return copy_linear(self, weights, {"soft_q": "q", "soft_kv": "kv", "out": "out"})

    def forward(self, x: Tensor, state: MonotonicState) -> Tensor:
        assert isinstance(state, LookbackState)
        query = self.query(x)  # [N, T, A]
        q = split_heads(self.soft_q(x), self.heads)  # [N, H, T, d]
        if self.training or self.soft_decisions:
            context = self._expected_lookback(query, q, state)
        else:
            context = self._hard_lookback(query, q, state)
        return self.out(context.to(x.dtype))

    # ------------------------------------------------------------------ training

    def _expected_lookback(self, query: Tensor, q: Tensor, state: LookbackState) -> Tensor:
        """Context under the expected soft attention.  query [N, T, A], q [N, H, T, d] -> [N, T, D]"""
        assert state.soft_k is not None and state.soft_v is not None
        n, t, _ = query.shape
        b, s = state.mask.shape
        k = n // b
        energy = unfold(self.energy(fold(query, b), state.keys), n).float()  # [N, T, S]
        if self.noise > 0 and self.training:
            energy = energy + self.noise * torch.randn_like(energy)
        mask = state.mask.repeat_interleave(k, dim=0)  # [N, S]
        lengths = state.lengths.repeat_interleave(k, dim=0)  # [N]
        previous = state.alpha
        if previous is None:
            previous = energy.new_zeros(n, s)
            previous[:, 0] = 1.0
        steps = []
        for i in range(t):
            previous = preserve_mass(expected_alignment(energy[:, i], previous, mask), lengths)
            steps.append(previous)
        if not steps:
            return query.new_zeros(n, 0, self.out.in_features)
        state.alpha = previous
        alpha = torch.stack(steps, dim=1)  # [N, T, S]
        self._delays = expected_delays(alpha, lengths)  # [N, T]
        scores = q.view(b, k, self.heads, t, -1).transpose(1, 2).reshape(b, self.heads, k * t, -1)
        scores = scores @ state.soft_k.transpose(-1, -2) * scores.size(-1) ** -0.5  # [B, H, K*T, S]
        scores = scores.view(b, self.heads, k, t, s).transpose(1, 2).reshape(n, self.heads, t, s)
        beta = lookback_weights(alpha, scores, mask, chunk=self.chunk)  # [N, H, T, S]
        beta = F.dropout(beta, self.dropout, self.training).to(state.soft_v.dtype)
        beta = beta.view(b, k, self.heads, t, s).transpose(1, 2).reshape(b, self.heads, k * t, s)
        out = (beta @ state.soft_v).view(b, self.heads, k, t, -1).transpose(1, 2)  # [B, K, H, T, d]
        return merge_heads(out.reshape(n, self.heads, t, -1))

    # ------------------------------------------------------------------ test time

    def _hard_lookback(self, query: Tensor, q: Tensor, state: LookbackState) -> Tensor:
        """Context under hard decisions.  query [N, T, A], q [N, H, T, d] -> [N, T, D]"""
        n, t, _ = query.shape
        b = state.keys.size(0)
        k = n // b
        sentence = torch.arange(n, device=query.device) // k  # [N]
        if state.position is None:
            state.position = torch.zeros(n, dtype=torch.long, device=query.device)
        contexts = []
        for i in range(t):
            state.position = self._select(query[:, i], sentence, state)  # [N]; may read more source
            assert state.soft_k is not None and state.soft_v is not None
            # selecting nothing (the source's end) attends as if the end symbol were selected
            seen = torch.minimum(state.position + 1, state.lengths[sentence])  # [N]
            source = torch.arange(state.soft_k.size(2), device=query.device).unsqueeze(0)  # [1, S]
            allowed = source < seen.unsqueeze(1)  # [N, S]
            if self.chunk is not None:
                allowed = allowed & (source >= seen.unsqueeze(1) - self.chunk)
            allowed = allowed.view(b, 1, k, -1)  # [B, 1, K, S]
            step = q[:, :, i].reshape(b, k, self.heads, -1).transpose(1, 2)  # [B, H, K, d]
            out = F.scaled_dot_product_attention(step, state.soft_k, state.soft_v, attn_mask=allowed)
            contexts.append(out.transpose(1, 2).reshape(n, -1))  # [N, D]
        if not contexts:
            return query.new_zeros(n, 0, self.out.in_features)
        return torch.stack(contexts, dim=1)
