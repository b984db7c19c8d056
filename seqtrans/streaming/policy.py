"""How far a learned read policy's training matches its test-time decisions.

Monotonic attention (Raffel et al. 2017) trains with the expected alignment and decodes
with hard decisions (select where p >= 0.5); the two agree only where the selection
probabilities are near 0 or 1. For every decoder layer whose encoder-decoder attention
is monotonic (``monotonic``, ``milk``, ``mocha``, ``mma_hard``, ``mma_il``, ``mma_chunk``), teacher-forced on
given pairs in ``eval()`` mode (hard contexts, no noise), this reports:

- ``undecided``: the share of selection probabilities within [0.1, 0.9], over every
  (target step, source position, head) of the real tokens;
- ``gap``: the mean distance, in source positions, between where a head's hard decision
  stops and where its expected alignment stops on average (selecting nothing counts as
  stopping at the source length, as hard monotonic attention does);
- ``agreement``: the mean probability the expected alignment gives the hard decision's
  position (1 where they agree exactly);
- ``ahead``: the mean signed distance, hard stop minus expected stop: above 0 where the
  hard decisions read past where training attended;
- ``nothing``: the share of steps whose hard decision selects no position (the source
  read to its end), where hard monotonic attention's context is zero (a monotonic head of
  MMA stops at the last position instead: 0 there);
- ``histogram``: the shares of the selection probabilities in ten bins of width 0.1.

Hard decisions stop where p >= the threshold in effect
(:func:`seqtrans.attention.monotonic.selecting`, 0.5 outside it), so that a report inside
``selecting(t)`` is that of decoding at ``decode.monotonic_threshold=t``.

All are computed from the same queries (each layer's input under hard decisions), so
the gap is the policy's own, not that of the states below it.

Shapes: B sentences, H heads, T target, S source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from seqtrans.attention.maps import HeadMonotonicWeights, MonotonicWeights
from seqtrans.data.vocab import PAD
from seqtrans.model.transformer import Transformer, attention_maps

BINS = 10  # the histogram's bins of the selection probabilities, each 0.1 wide


@dataclass(frozen=True)
class LayerPolicy:
    """One decoder layer's read policy, over the pairs it was measured on."""

    layer: int  # counted from 1
    heads: int  # monotonic heads in the layer
    undecided: float  # share of selection probabilities in [0.1, 0.9]
    gap: float  # mean |hard stop - expected stop|, in source positions
    agreement: float  # mean expected probability of the hard stop
    ahead: float  # mean hard stop - expected stop, in source positions
    nothing: float  # share of steps whose hard decision selects no position
    histogram: tuple[float, ...]  # shares of the selection probabilities in [0, 0.1), ..., [0.9, 1]


@dataclass
class _Sums:
    heads: int = 0
    within: float = 0.0
    pairs: float = 0.0
    gap: float = 0.0
    agreement: float = 0.0
    ahead: float = 0.0
    nothing: float = 0.0
    steps: float = 0.0
    bins: Tensor = field(default_factory=lambda: torch.zeros(BINS, dtype=torch.float64))


def _head_axis(w: MonotonicWeights | HeadMonotonicWeights) -> tuple[Tensor, Tensor, Tensor]:
    """positions [B, H, T], expected [B, H, T, S], probabilities [B, H, T, S]"""
    if isinstance(w, HeadMonotonicWeights):
        return w.positions, w.expected.float(), w.probabilities.float()
    if w.probabilities is None:
        raise ValueError("the monotonic weights carry no selection probabilities")
    return w.positions.unsqueeze(1), w.expected.float().unsqueeze(1), w.probabilities.float().unsqueeze(1)


def _stops(expected: Tensor, lengths: Tensor) -> Tensor:
    """The expected alignment with the probability of selecting nothing at each row's
    source length.  expected [B, H, T, S], lengths [B] -> [B, H, T, S+1]"""
    b, h, t, s = expected.shape
    rest = (1 - expected.sum(-1, keepdim=True)).clamp(min=0)  # [B, H, T, 1]
    nothing = torch.zeros(b, h, t, s + 1, device=expected.device)
    nothing = nothing.scatter(-1, lengths.view(b, 1, 1, 1).expand(b, h, t, 1), rest)
    return torch.cat([expected, expected.new_zeros(b, h, t, 1)], dim=-1) + nothing


@torch.no_grad()
def policy_report(model: Transformer, batches: Iterable[tuple[Tensor, Tensor]]) -> list[LayerPolicy]:
    """Per decoder layer with a monotonic policy: :class:`LayerPolicy` over ``batches`` of
    (src [B, S] with end symbols, tgt_in [B, T] starting with BOS), padded with PAD.
    The model is put in ``eval()`` mode."""
    model.eval()
    sums: dict[int, _Sums] = {}
    for src, tgt_in in batches:
        maps = attention_maps(model, src, tgt_in)
        lengths = src.ne(PAD).sum(1)  # [B]
        steps = tgt_in.ne(PAD)  # [B, T]
        real = steps.unsqueeze(2) & src.ne(PAD).unsqueeze(1)  # [B, T, S]
        for layer, w in enumerate(maps.cross, start=1):
            if not isinstance(w, (MonotonicWeights, HeadMonotonicWeights)):
                continue
            positions, expected, probabilities = _head_axis(w)
            h = positions.size(1)
            total = sums.setdefault(layer, _Sums(heads=h))
            keep = real.unsqueeze(1).expand_as(probabilities)  # [B, H, T, S]
            total.within += float((((probabilities >= 0.1) & (probabilities <= 0.9)) & keep).sum())
            total.pairs += float(keep.sum())
            stops = _stops(expected, lengths)  # [B, H, T, S+1]
            where = torch.arange(stops.size(-1), device=stops.device, dtype=stops.dtype)
            mean_stop = (stops * where).sum(-1)  # [B, H, T]
            on_step = steps.unsqueeze(1).expand_as(mean_stop)  # [B, H, T]
            ahead = positions.to(stops.dtype) - mean_stop  # [B, H, T]
            total.gap += float((ahead.abs() * on_step).sum())
            total.ahead += float((ahead * on_step).sum())
            total.nothing += float(((positions >= lengths.view(-1, 1, 1)) & on_step).sum())
            bin_of = (probabilities[keep] * BINS).long().clamp(max=BINS - 1)
            total.bins += torch.bincount(bin_of, minlength=BINS).double().cpu()
            total.agreement += float((stops.gather(-1, positions.unsqueeze(-1)).squeeze(-1) * on_step).sum())
            total.steps += float(on_step.sum())
    return [LayerPolicy(layer, s.heads, s.within / max(s.pairs, 1), s.gap / max(s.steps, 1),
                        s.agreement / max(s.steps, 1), s.ahead / max(s.steps, 1),
                        s.nothing / max(s.steps, 1),
                        tuple(float(x) for x in s.bins / max(s.pairs, 1)))
            for layer, s in sorted(sums.items())]


def split_report(loaded: Any, split: str = "dev", *, batch: int = 64) -> list[LayerPolicy]:
    """:func:`policy_report` of a loaded run (:class:`seqtrans.inference.loaded.Loaded`)
    on a split of its task, teacher-forced with the references."""
    from seqtrans.data.batches import pad_batch
    from seqtrans.data.encoding import source_ids, target_ids
    from seqtrans.data.vocab import BOS
    from seqtrans.inference.evaluation import read_split

    examples = read_split(loaded.task, split).examples

    def batches() -> Iterable[tuple[Tensor, Tensor]]:
        for start in range(0, len(examples), batch):
            chunk = examples[start : start + batch]
            src = pad_batch([source_ids(loaded.codec, e.source) for e in chunk]).to(loaded.device)
            tgt = pad_batch([target_ids(loaded.codec, e.target) for e in chunk], before=BOS).to(loaded.device)
            yield src, tgt

    return policy_report(loaded.model, batches())
