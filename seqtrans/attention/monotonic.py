"""Monotonic attention, Raffel et al. (2017), "Online and Linear-Time Attention by
Enforcing Monotonic Alignments".

At output step i, starting from the position t_{i-1} attended at the previous step, the
decoder inspects source positions j = t_{i-1}, t_{i-1} + 1, ... and stops at the first
one it selects, with probability

    p_ij = sigmoid(e_ij),   e_ij = g * v^T / ||v|| * tanh(W s_i + V h_j + b) + r    (sec. 2.5)

(s_i the decoder state, h_j the encoder state); the context is c_i = h_{t_i}, or zero
when no position is selected, after which nothing is attended any more.

Training uses the expected alignment (eq. 9-14),

    alpha_ij = p_ij * q_ij,   q_ij = (1 - p_i,j-1) q_i,j-1 + alpha_i-1,j,   alpha_0 = delta_1,

in its parallel form over j (appendix C.1). With L_j = sum_{l<j} log(1 - p_il),

    q_ij = sum_{k<=j} alpha_i-1,k exp(L_j - L_k) = exp(L_j + logcumsumexp_k(log alpha_i-1,k - L_k)).

The paper divides by cumprod(1 - p) clamped to [eps, 1]; that is exact only while the
product stays above eps, which selection probabilities near 1 (what training drives
them to) break within a few positions. Working in log space throughout, with
log p = logsigmoid(e) and log(1 - p) = logsigmoid(-e), needs no such clamp; the one
clamp left floors alpha_i-1 at 1e-30 before its logarithm, which keeps gradients finite
and adds at most S * 1e-30 of mass. Zero-mean Gaussian noise of standard deviation
``noise`` is added to e before the sigmoid while training only: it is what drives the
probabilities towards 0 or 1 (the model learns energies the noise cannot flip), so that
the expected alignment of training becomes the hard alignment of decoding. A
``temperature`` below 1 (not in the paper; SeamlessStreaming's monotonic decoder uses
0.2) divides e, sharpening the probabilities without changing any hard decision.
:mod:`seqtrans.streaming.policy` measures how far the two still differ.

At test time (``eval()``) attention is hard: from t_{i-1}, move right until p_ij >= 0.5
(e_ij >= 0), attend there, or attend to nothing if no position qualifies. The threshold
0.5 is the paper's; :func:`selecting` sets another for decoding (``decode.monotonic_threshold``): a
lower one writes sooner, a higher one reads further first, so that one trained policy
decodes at several latencies (as EMMA, Ma et al. 2023, does with its threshold). Energies are
computed only for the positions inspected, a few at a time, so decoding does O(|S| + |T|)
energy evaluations in all and never looks past the position it attends: this is what lets
``seqtrans.streaming.decoder`` decode while the source is still arriving.

Single-head, as in the paper: one monotonic head per decoder layer. Monotonic multihead
attention (every head monotonic, a step written once every head has stopped) is
:mod:`seqtrans.attention.multihead_monotonic`.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T target
positions this call, A energy width, D model, W positions inspected at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.common import ROW, SENTENCE, fold, reorder_fields, unfold
from seqtrans.attention.maps import MonotonicWeights

LOG_FLOOR = math.log(1e-30)
SCAN = 4  # source positions whose energy hard attention evaluates at once
_THRESHOLD: ContextVar[float] = ContextVar("selection_threshold", default=0.5)


@contextmanager
def selecting(threshold: float | None) -> Iterator[None]:
    """Monotonic attention prepared inside this block selects a source position once
    its selection probability reaches ``threshold``, in (0, 1), instead of 0.5. None
    changes nothing (the enclosing block's threshold, else 0.5)."""
    if threshold is None:
        yield
        return
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"a selection threshold must lie in (0, 1), got {threshold}")
    token = _THRESHOLD.set(threshold)
    try:
        yield
    finally:
        _THRESHOLD.reset(token)


def selection_floor() -> float:
    """The energy at which the selection probability reaches the threshold in effect:
    hard decisions select where e >= this (0 at the paper's 0.5)."""
    p = _THRESHOLD.get()
    return math.log(p / (1.0 - p))


def _log_terms(energy: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """log p_ij and L_ij = sum_{l<j} log(1 - p_il), with padding never selected.
    energy [..., S], mask [R, S] (broadcast over the middle axes) -> 2 x [..., S]"""
    log_p = F.logsigmoid(energy)
    log_skip = F.logsigmoid(-energy)  # log(1 - p)
    if mask is not None:
        keep = mask.view(mask.size(0), *([1] * (energy.dim() - 2)), mask.size(1))
        log_p = log_p.masked_fill(~keep, float("-inf"))
        log_skip = log_skip.masked_fill(~keep, 0.0)
    return log_p, torch.cumsum(log_skip, dim=-1) - log_skip  # exclusive cumulative sum


def _step(log_p: Tensor, skipped: Tensor, previous: Tensor) -> Tensor:
    """alpha_ij = p_ij sum_{k<=j} alpha_i-1,k exp(L_j - L_k), in log space.  [R, S] -> [R, S]"""
    log_previous = torch.log(previous.clamp(min=1e-30))
    return torch.exp(log_p + skipped + torch.logcumsumexp(log_previous - skipped, dim=-1))


def expected_alignment(energy: Tensor, previous: Tensor, mask: Tensor | None = None) -> Tensor:
    """One step of the expected alignment, in parallel over source positions.

    energy [R, S] (e_ij), previous [R, S] (alpha_i-1), mask [R, S] (True at real
    positions; padding is never selected) -> alpha_i [R, S]
    """
    return _step(*_log_terms(energy, mask), previous)


def expected_alignments(energy: Tensor, mask: Tensor | None = None, *,
                        initial: Tensor | None = None) -> Tensor:
    """The expected alignments of consecutive output steps: only the dependence on the
    previous step is sequential, everything else is computed for all steps at once.

    energy [R, T, S], mask [R, S], initial [R, S] (alpha_0; default delta at the first
    position) -> [R, T, S]
    """
    r, t, s = energy.shape
    previous = initial
    if previous is None:
        previous = energy.new_zeros(r, s)
        previous[:, 0] = 1.0
    log_p, skipped = _log_terms(energy, mask)  # [R, T, S] each
    steps = []
    for i in range(t):
        previous = _step(log_p[:, i], skipped[:, i], previous)
        steps.append(previous)
    return torch.stack(steps, dim=1) if steps else energy.new_zeros(r, 0, s)


def hard_alignment(energy: Tensor, lengths: Tensor, *, floor: float = 0.0) -> Tensor:
    """Where hard monotonic attention attends at each step, from all energies at once: the
    first position from the previous step's with e >= ``floor`` (:func:`selection_floor`;
    0 at the threshold 0.5), or the source length (nothing) from the first step that finds
    none.  energy [R, T, S], lengths [R] -> [R, T] (long)"""
    r, t, s = energy.shape
    source = torch.arange(s, device=energy.device)  # [S]
    inside = source < lengths.unsqueeze(1)  # [R, S]
    position = torch.zeros(r, dtype=torch.long, device=energy.device)
    steps = []
    for i in range(t):
        hit = (energy[:, i] >= floor) & inside & (source >= position.unsqueeze(1))  # [R, S]
        position = torch.where(hit.any(1), hit.long().argmax(1), lengths)
        steps.append(position)
    return torch.stack(steps, dim=1) if steps else lengths.new_zeros(r, 0)


def expected_delays(alpha: Tensor, lengths: Tensor) -> Tensor:
    """The expected delay of each output step: the source words read (the end symbol not
    counted) when it attends, under the expected alignment; the mass that selects nothing
    reads the whole source.  alpha [R, T, S], lengths [R] (>= 1) -> [R, T]"""
    words = (lengths - 1).clamp(min=0).unsqueeze(1)  # [R, 1]
    positions = torch.arange(1, alpha.size(-1) + 1, device=alpha.device).unsqueeze(0)  # [1, S]
    read = torch.minimum(positions, words)  # [R, S]
    rest = (1 - alpha.sum(-1)).clamp(min=0)  # [R, T]
    return (alpha * read.unsqueeze(1)).sum(-1) + rest * words.to(alpha.dtype)


class SourceStream(Protocol):
    """A source that arrives while decoding (one sentence)."""

    def states_from(self, position: int) -> Tensor | None:
        """The encoder states [1, S', D] of the source positions from ``position`` on,
        reading more of the source when none is there yet; None once the source has
        ended and every position was given."""
        ...


@dataclass
class MonotonicState:
    """A source's energy keys and values, and where each hypothesis attends.

    ``position`` (hard attention) is the last position each hypothesis attended, or its
    source length once it attends to nothing; ``alpha`` (expected attention) is the
    previous step's alignment. Both start at the first position with the first step.
    Every change is a reassignment of a field, never a write into a tensor a field holds,
    so a caller may undo a decoding step by restoring a shallow copy of the fields.
    """

    keys: Tensor = field(metadata=SENTENCE)  # [B, S, A]: V h_j + b
    values: Tensor = field(metadata=SENTENCE)  # [B, S, D]: h_j
    mask: Tensor = field(metadata=SENTENCE)  # [B, S], True at real tokens
    lengths: Tensor = field(metadata=SENTENCE)  # [B]: source positions available
    position: Tensor | None = field(default=None, metadata=ROW)  # [N]
    alpha: Tensor | None = field(default=None, metadata=ROW)  # [N, S]
    source: SourceStream | None = None  # where more positions come from; None: all are here
    floor: float = field(default_factory=selection_floor)  # select where e >= floor (selecting)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


class MonotonicAttention(nn.Module):
    """``prepare(memory [B, S, D], mask [B, S]) -> MonotonicState``;
    ``forward(x [N, T, D], state) -> [N, T, D]``: expected attention in training,
    hard attention in ``eval()``."""

    def __init__(self, d_model: int, *, dim: int = 0, noise: float = 1.0, r_init: float = -4.0,
                 temperature: float = 1.0) -> None:
        super().__init__()
        dim = dim or d_model
        self.noise = noise
        self.temperature = temperature
        # Analysis only: decode offline with the expected (training-time) alignment and
        # no noise instead of hard decisions, to tell the policy's loss from the model's.
        self.soft_decisions = False
        self.query = nn.Linear(d_model, dim, bias=False)  # W
        self.key = nn.Linear(d_model, dim)  # V and b
        self.v = nn.Parameter(torch.empty(dim))
        self.g = nn.Parameter(torch.tensor(1 / math.sqrt(dim)))
        self.r = nn.Parameter(torch.tensor(float(r_init)))
        self.out = nn.Linear(d_model, d_model)
        self._delays: Tensor | None = None
        nn.init.xavier_uniform_(self.query.weight)
        nn.init.xavier_uniform_(self.key.weight)
        nn.init.zeros_(self.key.bias)
        nn.init.uniform_(self.v, -1 / math.sqrt(dim), 1 / math.sqrt(dim))
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def energy(self, query: Tensor, keys: Tensor) -> Tensor:
        """e = (g v^T/||v|| tanh(W s + V h + b) + r) / temperature.
        query [..., Q, A], keys [..., S, A] -> [..., Q, S]"""
        v = self.g * self.v / self.v.norm()
        hidden = torch.tanh(query.unsqueeze(-2) + keys.unsqueeze(-3))  # [..., Q, S, A]
        out = hidden @ v + self.r
        # a temperature below 1 sharpens the probabilities; the decisions (e >= 0) stay
        return out if self.temperature == 1.0 else out / self.temperature

    def prepare(self, memory: Tensor, mask: Tensor) -> MonotonicState:
        return MonotonicState(self.key(memory), memory, mask, mask.sum(1))

    def follow(self, source: SourceStream, *, like: Tensor) -> MonotonicState:
        """The state of one hypothesis over a source that arrives while decoding: it starts
        empty and pulls encoder states from ``source`` when hard attention runs out of
        positions to inspect."""
        d = self.out.in_features
        return MonotonicState(like.new_zeros(1, 0, self.key.out_features), like.new_zeros(1, 0, d),
                              torch.zeros(1, 0, dtype=torch.bool, device=like.device),
                              torch.zeros(1, dtype=torch.long, device=like.device), source=source)

    def extend(self, state: MonotonicState, memory: Tensor) -> None:
        """Append the encoder states of newly arrived source positions.  memory [B, S', D]"""
        state.keys = torch.cat([state.keys, self.key(memory)], dim=1)
        state.values = torch.cat([state.values, memory], dim=1)
        state.mask = torch.cat([state.mask, state.mask.new_ones(memory.shape[:2])], dim=1)
        state.lengths = state.lengths + memory.size(1)

    def take_delays(self) -> Tensor | None:
        """The expected delays [N, T] of the last training forward pass (then forgotten),
        for ``train.latency_weight``."""
        delays, self._delays = self._delays, None
        return delays

    def forward(self, x: Tensor, state: MonotonicState) -> Tensor:
        query = self.query(x)  # [N, T, A]
        expected = self.training or self.soft_decisions
        context = self._expected(query, state) if expected else self._hard(query, state)
        return self.out(context.to(x.dtype))

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> MonotonicWeights:
        """The hard and the expected alignment.  x [B, T, D], memory [B, S, D], mask [B, S]"""
        energy = self.energy(self.query(x), self.key(memory)).float()  # [B, T, S]
        return MonotonicWeights(hard_alignment(energy, mask.sum(1), floor=selection_floor()),
                                expected_alignments(energy, mask),
                                torch.sigmoid(energy) * mask.unsqueeze(1))

    # ------------------------------------------------------------------ training

    def _expected(self, query: Tensor, state: MonotonicState) -> Tensor:
        """Context under the expected alignment.  query [N, T, A] -> [N, T, D]"""
        n, t, _ = query.shape
        b, s = state.mask.shape
        energy = unfold(self.energy(fold(query, b), state.keys), n).float()  # [N, T, S]
        if self.noise > 0 and self.training:
            energy = energy + self.noise * torch.randn_like(energy)
        mask = state.mask.repeat_interleave(n // b, dim=0)  # [N, S]
        alpha = expected_alignments(energy, mask, initial=state.alpha)  # [N, T, S]
        if t:
            state.alpha = alpha[:, -1]
        self._delays = expected_delays(alpha, state.lengths.repeat_interleave(n // b, dim=0))
        weights = fold(alpha.to(state.values.dtype), b)  # [B, K*T, S]
        return unfold(weights @ state.values, n)  # [N, T, D]

    # ------------------------------------------------------------------ test time

    def _hard(self, query: Tensor, state: MonotonicState) -> Tensor:
        """Context under hard monotonic attention.  query [N, T, A] -> [N, T, D]"""
        n, t, _ = query.shape
        b = state.keys.size(0)
        sentence = torch.arange(n, device=query.device) // (n // b)  # [N]
        if state.position is None:
            state.position = torch.zeros(n, dtype=torch.long, device=query.device)
        contexts = []
        for i in range(t):
            chosen = self._select(query[:, i], sentence, state)  # [N]
            state.position = chosen
            attends = chosen < state.lengths[sentence]
            index = chosen.clamp(max=state.values.size(1) - 1).clamp(min=0)
            picked = state.values[sentence, index]  # [N, D]
            contexts.append(picked * attends.unsqueeze(-1).to(picked.dtype))
        if not contexts:
            return query.new_zeros(n, 0, state.values.size(-1))
        return torch.stack(contexts, dim=1)  # [N, T, D]

    def _select(self, query: Tensor, sentence: Tensor, state: MonotonicState) -> Tensor:
        """Where each hypothesis attends at this step: the first position from its last one
        with e >= floor, or its source length if none.  query [N, A] -> [N]"""
        assert state.position is not None
        position = state.position.clone()
        chosen = position.clone()
        pending = torch.arange(query.size(0), device=query.device)
        offsets = torch.arange(SCAN, device=query.device)
        while pending.numel():
            limit = state.lengths[sentence[pending]]  # [R] positions available
            starved = position[pending] >= limit
            if bool(starved.any()):
                if state.source is not None:
                    more = state.source.states_from(state.values.size(1))
                    if more is not None:
                        self.extend(state, more)
                        continue  # more source positions arrived; scan on
                    state.source = None
                chosen[pending[starved]] = limit[starved]  # attends to nothing
                pending, limit = pending[~starved], limit[~starved]
                if not pending.numel():
                    break
            cols = position[pending].unsqueeze(1) + offsets  # [R, W]
            valid = cols < limit.unsqueeze(1)
            keys = state.keys[sentence[pending].unsqueeze(1), torch.minimum(cols, limit.unsqueeze(1) - 1)]
            energy = self.energy(query[pending].unsqueeze(1), keys).squeeze(1)  # [R, W]
            hit = (energy >= state.floor) & valid
            found = hit.any(1)
            first = hit.long().argmax(1)  # the first selected position
            chosen[pending[found]] = cols[found, first[found]]
            pending = pending[~found]
            position[pending] += valid[~found].sum(1)
        return chosen
