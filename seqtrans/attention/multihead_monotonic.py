"""Monotonic multihead attention (MMA), Ma et al. (2020), "Monotonic Multihead Attention",
as fairseq's ``examples/simultaneous_translation`` trains it.

Every head of every decoder layer is its own monotonic head (Raffel et al. 2017): at
output step i, head h moves right from the position t_{i-1,h} it stopped at, and stops
at the first position j it selects, with probability

    p_ijh = sigmoid((q_ih . k_jh / sqrt(d) + r) / temperature)   (plus N(0, noise^2) while training)

- **MMA-H** (``mma_hard``): head h attends to the value at t_ih alone.
- **MMA-IL** (``mma_il``, infinite lookback): head h attends softly (its own scaled
  dot-product scores) over every position up to t_ih, as MILk does per layer.
- **Chunkwise** (``mma_chunk``, not in Ma et al.): head h attends softly over the w
  positions ending at t_ih, as MoChA (Chiu and Raffel 2018) does per layer; MMA-IL is
  its w = infinity.

A head that selects nothing stops at the last source position, the end symbol (where
MMA-IL then sees the whole source). Training uses each head's expected alignment
(:func:`~seqtrans.attention.monotonic.expected_alignment`, in log space) with that
"mass preservation": the probability of selecting nothing goes to the last position
(:func:`~seqtrans.attention.lookback.preserve_mass`), so training sees what decoding
does. MMA-IL's expected soft attention is MILk's, the chunkwise form's MoChA's
(:func:`~seqtrans.attention.lookback.lookback_weights`), per head.

At test time (``eval()``) each head reads while p < 0.5 (or the threshold that
:func:`~seqtrans.attention.monotonic.selecting` sets); a step writes only when every
head of every layer has stopped, so its delay is the largest over heads. Each layer
pulls source positions from an arriving source (``follow``) as far as its heads need,
which is how ``seqtrans.streaming.decoder`` decodes while the source arrives.

The expected delay of head h at step i is sum_j alpha_ijh min(j + 1, |x|) source tokens
(reported per head for the latency losses, :func:`seqtrans.training.loss.latency_losses`).

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, S source, T target
positions this call, H heads, D model, d = D/H.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.common import ROW, SENTENCE, copy_linear, masked_softmax, reorder_fields
from seqtrans.attention.lookback import lookback_weights, preserve_mass
from seqtrans.attention.maps import HeadMonotonicWeights
from seqtrans.attention.monotonic import SourceStream, expected_alignment, selection_floor
from seqtrans.attention.scaled_dot import merge_heads, split_heads


@dataclass
class MultiheadMonotonicState:
    """The source's keys and values per head, and where each hypothesis's heads stopped.

    Every change is a reassignment of a field (a new tensor, ``torch.cat``), never a write
    into a tensor a field holds: a caller may undo a decoding step that ran out of source
    by restoring a shallow copy of the fields.
    """

    k_mono: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]: the monotonic energy's keys
    v: Tensor = field(metadata=SENTENCE)  # [B, H, S, d]
    mask: Tensor = field(metadata=SENTENCE)  # [B, S], True at real tokens
    lengths: Tensor = field(metadata=SENTENCE)  # [B]: source positions available
    k_soft: Tensor | None = field(default=None, metadata=SENTENCE)  # [B, H, S, d]: MMA-IL's soft keys
    position: Tensor | None = field(default=None, metadata=ROW)  # [N, H]: where each head stopped last
    alpha: Tensor | None = field(default=None, metadata=ROW)  # [N, H, S]: the last expected alignment
    source: SourceStream | None = None  # where more positions come from; None: all are here
    floor: float = field(default_factory=selection_floor)  # a head stops where e >= floor (selecting)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        reorder_fields(self, rows, sentences)


def per_row(scores: Tensor, rows: int) -> Tensor:
    """Sentence-major head scores to rows.  [B, H, K*T, S] -> [N, H, T, S]"""
    b, h, kt, s = scores.shape
    k = rows // b
    return scores.view(b, h, k, kt // k, s).transpose(1, 2).reshape(rows, h, kt // k, s)


def per_sentence(x: Tensor, sentences: int) -> Tensor:
    """Rows to sentence-major heads, the hypotheses of a sentence side by side.
    [N, H, T, F] -> [B, H, K*T, F]"""
    n, h, t, f = x.shape
    k = n // sentences
    return x.view(sentences, k, h, t, f).transpose(1, 2).reshape(sentences, h, k * t, f)


def head_alignments(energy: Tensor, mask: Tensor, lengths: Tensor, *,
                    initial: Tensor | None = None) -> Tensor:
    """Each head's expected alignment with mass preservation, step after step.
    energy [N, H, T, S], mask [N, S], lengths [N], initial [N, H, S] (default: all mass at
    the first position) -> [N, H, T, S]"""
    n, h, t, s = energy.shape
    rows_mask = mask.repeat_interleave(h, dim=0)  # [N*H, S]
    rows_lengths = lengths.repeat_interleave(h, dim=0)  # [N*H]
    if initial is None:
        previous = F.one_hot(energy.new_zeros(n * h, dtype=torch.long), s).to(energy.dtype)  # [N*H, S]
    else:
        previous = initial.reshape(n * h, s)
    flat = energy.reshape(n * h, t, s)  # [N*H, T, S]
    steps = []
    for i in range(t):
        previous = preserve_mass(expected_alignment(flat[:, i], previous, rows_mask), rows_lengths)
        steps.append(previous)
    if not steps:
        return energy.new_zeros(n, h, 0, s)
    return torch.stack(steps, dim=1).view(n, h, t, s)


def hard_positions(energy: Tensor, lengths: Tensor, *, floor: float = 0.0) -> Tensor:
    """Where each head stops at each step, from all energies at once: the first position
    from its previous one with e >= floor, or the last position if none.
    energy [N, H, T, S], lengths [N] -> [N, H, T] (long)"""
    n, h, t, s = energy.shape
    source = torch.arange(s, device=energy.device)  # [S]
    inside = source < lengths.view(n, 1, 1)  # [N, 1, S]
    last = (lengths - 1).view(n, 1).expand(n, h)  # [N, H]
    position = torch.zeros(n, h, dtype=torch.long, device=energy.device)
    steps = []
    for i in range(t):
        hit = (energy[:, :, i] >= floor) & inside & (source >= position.unsqueeze(-1))  # [N, H, S]
        position = torch.where(hit.any(-1), hit.long().argmax(-1), last)
        steps.append(position)
    return torch.stack(steps, dim=2) if steps else lengths.new_zeros(n, h, 0)


class MultiheadMonotonicAttention(nn.Module):
    """``prepare(memory [B, S, D], mask [B, S]) -> MultiheadMonotonicState``;
    ``forward(x [N, T, D], state) -> [N, T, D]``: expected attention in training (recording
    each head's expected delays), hard decisions in ``eval()``. ``lookback``: MMA-IL, or
    with ``chunk`` = w, soft attention over the w positions ending where a head stops."""

    def __init__(self, d_model: int, heads: int, *, lookback: bool, chunk: int | None = None,
                 noise: float = 1.0, r_init: float = -4.0, temperature: float = 1.0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if chunk is not None and (chunk < 1 or not lookback):
            raise ValueError(f"a chunk holds at least one position and needs lookback, got {chunk}")
        self.heads = heads
        self.lookback = lookback
        self.chunk = chunk
        self.noise = noise
        self.temperature = temperature
        self.dropout = dropout
        # Analysis only: decode with the expected alignment (no noise) instead of hard decisions.
        self.soft_decisions = False
        self.q_mono = nn.Linear(d_model, d_model)
        self.k_mono = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.q_soft = nn.Linear(d_model, d_model) if lookback else None
        self.k_soft = nn.Linear(d_model, d_model) if lookback else None
        self.r = nn.Parameter(torch.tensor(float(r_init)))  # the energy's bias, shared by the heads
        self.out = nn.Linear(d_model, d_model)
        for lin in (self.q_mono, self.k_mono, self.v, self.q_soft, self.k_soft):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2))
                nn.init.zeros_(lin.bias)
        nn.init.xavier_uniform_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self._delays: Tensor | None = None

    def adopt(self, weights: dict[str, Tensor]) -> list[str]:
        """Start from a scaled-dot encoder-decoder attention (``run --init``): its value and
        output projections become this one's, and MMA-IL's soft heads take its query and
        key projections; the monotonic heads, the read policy, start new."""
        kv_w, kv_b = weights.get("kv.weight"), weights.get("kv.bias")
        split = {}
        if kv_w is not None and kv_b is not None:  # [2D, D] -> keys, values
            (k_w, v_w), (k_b, v_b) = kv_w.chunk(2, dim=0), kv_b.chunk(2, dim=0)
            split = {"k.weight": k_w, "k.bias": k_b, "v.weight": v_w, "v.bias": v_b}
        names = {"v": "v", "out": "out", **({"q_soft": "q", "k_soft": "k"} if self.lookback else {})}
        return copy_linear(self, {**weights, **split}, names)

    # ------------------------------------------------------------------ the source

    def _keys(self, memory: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """memory [B, S, D] -> monotonic keys, values, soft keys (MMA-IL), each [B, H, S, d]"""
        soft = split_heads(self.k_soft(memory), self.heads) if self.k_soft is not None else None
        return split_heads(self.k_mono(memory), self.heads), split_heads(self.v(memory), self.heads), soft

    def prepare(self, memory: Tensor, mask: Tensor) -> MultiheadMonotonicState:
        k_mono, v, k_soft = self._keys(memory)
        return MultiheadMonotonicState(k_mono, v, mask, mask.sum(1), k_soft=k_soft)

    def follow(self, source: SourceStream, *, like: Tensor) -> MultiheadMonotonicState:
        """The state of one hypothesis over a source that arrives while decoding: it starts
        empty and pulls encoder states from ``source`` while a head finds nothing to select."""
        d = self.out.in_features // self.heads
        empty = like.new_zeros(1, self.heads, 0, d)
        return MultiheadMonotonicState(empty, empty, torch.zeros(1, 0, dtype=torch.bool, device=like.device),
                                       torch.zeros(1, dtype=torch.long, device=like.device),
                                       k_soft=empty if self.lookback else None, source=source)

    def extend(self, state: MultiheadMonotonicState, memory: Tensor) -> None:
        """Append the encoder states of newly arrived positions (new tensors, never in place).
        memory [B, S', D]"""
        k_mono, v, k_soft = self._keys(memory)
        state.k_mono = torch.cat([state.k_mono, k_mono], dim=2)
        state.v = torch.cat([state.v, v], dim=2)
        if state.k_soft is not None and k_soft is not None:
            state.k_soft = torch.cat([state.k_soft, k_soft], dim=2)
        state.mask = torch.cat([state.mask, state.mask.new_ones(memory.shape[:2])], dim=1)
        state.lengths = state.lengths + memory.size(1)

    # ------------------------------------------------------------------ scores

    def _scores(self, q: Tensor, keys: Tensor) -> Tensor:
        """Scaled dot products of each head.  q [N, H, T, d], keys [B, H, S, d] -> [N, H, T, S]"""
        b = keys.size(0)
        folded = per_sentence(q, b)  # [B, H, K*T, d]
        return per_row(folded @ keys.transpose(-1, -2) * q.size(-1) ** -0.5, q.size(0))

    def _mix(self, weights: Tensor, values: Tensor) -> Tensor:
        """Weighted values per head, heads merged.  weights [N, H, T, S], values [B, H, S, d] -> [N, T, D]"""
        n = weights.size(0)
        out = per_sentence(weights.to(values.dtype), values.size(0)) @ values  # [B, H, K*T, d]
        return merge_heads(per_row(out, n))

    def energy(self, x: Tensor, keys: Tensor) -> Tensor:
        """e = (q . k / sqrt(d) + r) / temperature per head, without noise.
        x [N, T, D], keys [B, H, S, d] -> [N, H, T, S]"""
        out = self._scores(split_heads(self.q_mono(x), self.heads), keys) + self.r
        return out if self.temperature == 1.0 else out / self.temperature

    def _soft_scores(self, x: Tensor, keys: Tensor | None) -> Tensor:
        """MMA-IL's scores of each head.  x [N, T, D], keys [B, H, S, d] -> [N, H, T, S]"""
        assert self.q_soft is not None and keys is not None  # made with lookback
        return self._scores(split_heads(self.q_soft(x), self.heads), keys)

    def take_delays(self) -> Tensor | None:
        """Each head's expected delays [N, H, T] of the last training forward pass (then forgotten)."""
        delays, self._delays = self._delays, None
        return delays

    def forward(self, x: Tensor, state: MultiheadMonotonicState) -> Tensor:
        if self.training or self.soft_decisions:
            context = self._expected(x, state)
        else:
            context = self._hard(x, state)
        return self.out(context.to(x.dtype))

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> HeadMonotonicWeights:
        """Each head's hard positions, expected alignment, selection probabilities (no
        noise) and expected attention.  x [B, T, D], memory [B, S, D], mask [B, S]"""
        b, t, _ = x.shape
        k_mono, _, k_soft = self._keys(memory)
        energy = self.energy(x, k_mono).float()  # [B, H, T, S]
        lengths = mask.sum(1)
        alpha = head_alignments(energy, mask, lengths)  # [B, H, T, S]
        attention = alpha
        if k_soft is not None:
            h, s = self.heads, mask.size(1)
            scores = self._soft_scores(x, k_soft).reshape(b * h, 1, t, s)
            flat = lookback_weights(alpha.reshape(b * h, t, s), scores, mask.repeat_interleave(h, dim=0),
                                    chunk=self.chunk)  # [B*H, 1, T, S]
            attention = flat.view(b, h, t, s)
        return HeadMonotonicWeights(hard_positions(energy, lengths, floor=selection_floor()), alpha,
                                    torch.sigmoid(energy) * mask[:, None, None, :], attention)

    # ------------------------------------------------------------------ training

    def _expected(self, x: Tensor, state: MultiheadMonotonicState) -> Tensor:
        """Context under the expected alignments.  x [N, T, D] -> [N, T, D]"""
        n, t, _ = x.shape
        b, s = state.mask.shape
        energy = self.energy(x, state.k_mono).float()  # [N, H, T, S]
        if self.noise > 0 and self.training:
            energy = energy + self.noise * torch.randn_like(energy)
        mask = state.mask.repeat_interleave(n // b, dim=0)  # [N, S]
        lengths = state.lengths.repeat_interleave(n // b, dim=0)  # [N]
        alpha = head_alignments(energy, mask, lengths, initial=state.alpha)  # [N, H, T, S]
        if not t:
            return x.new_zeros(n, 0, self.out.in_features)
        state.alpha = alpha[:, :, -1]
        read = torch.minimum(torch.arange(1, s + 1, device=x.device).unsqueeze(0),
                             (lengths - 1).clamp(min=0).unsqueeze(1))  # [N, S]: source tokens read
        self._delays = (alpha * read[:, None, None, :]).sum(-1)  # [N, H, T]
        weights = alpha
        if self.lookback:
            h = self.heads
            scores = self._soft_scores(x, state.k_soft)  # [N, H, T, S]
            flat = lookback_weights(alpha.reshape(n * h, t, s), scores.reshape(n * h, 1, t, s),
                                    mask.repeat_interleave(h, dim=0), chunk=self.chunk)  # [N*H, 1, T, S]
            weights = flat.view(n, h, t, s)
        weights = F.dropout(weights, self.dropout, self.training)
        return self._mix(weights, state.v)

    # ------------------------------------------------------------------ test time

    def _hard(self, x: Tensor, state: MultiheadMonotonicState) -> Tensor:
        """Context under hard decisions.  x [N, T, D] -> [N, T, D]"""
        n, t, _ = x.shape
        if state.position is None:
            state.position = torch.zeros(n, self.heads, dtype=torch.long, device=x.device)
        contexts = []
        for i in range(t):
            step = x[:, i : i + 1]  # [N, 1, D]
            chosen = self._select(step, state)  # [N, H]; may read more source
            state.position = chosen
            s = state.mask.size(1)  # positions read so far
            source = torch.arange(s, device=x.device)  # [S]
            if self.lookback:
                # up to the position stopped at, within the source (the end: all of it)
                allowed = source.view(1, 1, 1, s) <= chosen.unsqueeze(-1).unsqueeze(-1)  # [N, H, 1, S]
                if self.chunk is not None:  # and only the chunk ending there
                    allowed = allowed & (source.view(1, 1, 1, s) > chosen[..., None, None] - self.chunk)
                scores = self._soft_scores(step, state.k_soft)  # [N, H, 1, S]
                weights = masked_softmax(scores, allowed)  # [N, H, 1, S]
            else:
                weights = (source.view(1, 1, 1, s) == chosen.unsqueeze(-1).unsqueeze(-1)).float()
            contexts.append(self._mix(weights, state.v))  # [N, 1, D]
        if not contexts:
            return x.new_zeros(n, 0, self.out.in_features)
        return torch.cat(contexts, dim=1)

    def _select(self, step: Tensor, state: MultiheadMonotonicState) -> Tensor:
        """Where each head stops at this step: the first position from its last one with
        e >= floor, reading more of an arriving source while some head finds none; the last
        position once the source has ended.  step [N, 1, D] -> [N, H]"""
        assert state.position is not None
        n = step.size(0)
        while True:
            b, s = state.mask.shape
            lengths = state.lengths.repeat_interleave(n // b, dim=0)  # [N]
            energy = self.energy(step, state.k_mono)[:, :, 0]  # [N, H, S]
            source = torch.arange(s, device=step.device)
            inside = (source >= state.position.unsqueeze(-1)) & (source < lengths.view(n, 1, 1))
            hit = (energy >= state.floor) & inside  # [N, H, S]
            found = hit.any(-1)
            if bool(found.all()) or state.source is None:
                break
            more = state.source.states_from(state.v.size(2))  # [1, S', D]
            if more is None:
                state.source = None  # the source has ended: what is here is all
            else:
                self.extend(state, more)
        last = (lengths - 1).clamp(min=0).unsqueeze(1).expand(n, self.heads)  # [N, H]
        return torch.where(found, hit.long().argmax(-1), last)
