"""Ensembles: several models of one vocabulary decoded and scored as one.

At every step the ensemble's next-token distribution is the weighted mean of the
members' log-probabilities, renormalised: ``log p(y) = sum_m w_m log p_m(y) - log Z``
(a product of experts; Sockeye's ``log_linear`` mode). Fairseq and Sockeye's default
average probabilities instead (``log mean_m p_m(y)``, a mixture); Marian sums weighted
log-probabilities without renormalising. The mean of log-probabilities rewards only
tokens every member finds likely, and, renormalised, the scores of an ensemble stay
log-probabilities, so beam search, its length penalty and ``seqtrans score`` treat an
ensemble exactly as one model (see ``docs/inference.md``).

An :class:`Ensemble` offers what the search loops use of a model (``encode``,
``start``, ``decode``; :class:`~seqtrans.decoding.protocol.SearchModel`), and, called
with a source and a shifted target, the teacher-forced scores of pairs. Members may
differ in architecture; each keeps its own decoding state (caches, model extensions' state).

Shapes: B sentences, N hypotheses, S source length, T target length, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from seqtrans.model.transformer import Encoded, Transformer


@dataclass
class EnsembleState:
    """The members' decoding states, reordered together."""

    members: list[Any]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        for state in self.members:
            state.reorder(rows, sentences)


class Ensemble:
    """Models of one target vocabulary whose log-probabilities are averaged (``weights``,
    normalised to sum to 1; equal by default) at every step."""

    def __init__(self, models: Sequence[Transformer], weights: Sequence[float] | None = None) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        if len(models) > 1:
            for model in models:
                model.check_supported("ensemble")
        weights = [1.0] * len(models) if weights is None else list(weights)
        if len(weights) != len(models):
            raise ValueError(f"{len(weights)} weights for {len(models)} models")
        if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"ensemble weights must be finite, non-negative and not all 0: {weights}")
        self.models = list(models)
        self.weights = [w / sum(weights) for w in weights]

    def __len__(self) -> int:
        return len(self.models)

    def eval(self) -> Ensemble:
        for model in self.models:
            model.eval()
        return self

    def combine(self, logits: Sequence[Tensor]) -> Tensor:
        """The members' next-token logits [..., V] -> the weighted mean of their
        log-probabilities [..., V] (float32), whose log-softmax is the ensemble's
        log-probability. One member's logits are returned as they are."""
        if len(logits) == 1:
            return logits[0]
        out = self.weights[0] * F.log_softmax(logits[0].float(), dim=-1)
        for weight, member in zip(self.weights[1:], logits[1:]):
            out = out + weight * F.log_softmax(member.float(), dim=-1)
        return out

    def encode(self, src: Tensor) -> list[Encoded]:
        """src [B, S] -> each member's encoding"""
        return [model.encode(src) for model in self.models]

    def start(self, encoded: list[Encoded], *, beam: int = 1, capacity: int = 64) -> EnsembleState:
        return EnsembleState([model.start(e, beam=beam, capacity=capacity)
                              for model, e in zip(self.models, encoded)])

    def decode_rows(self, tokens: Tensor, rows: Tensor, *, state: EnsembleState) -> Tensor:
        """:meth:`decode` of every hypothesis, the members' output products of ``rows`` [R]
        alone, combined.  tokens [N, T] -> [R, T, V]"""
        members = zip(self.models, state.members)
        return self.combine([model.decode_rows(tokens, rows, state=member) for model, member in members])

    def advance(self, tokens: Tensor, *, state: EnsembleState) -> None:
        """Read ``tokens`` [N, T] into every member's state without scoring them."""
        for model, member in zip(self.models, state.members):
            model.advance(tokens, state=member)

    def decode(self, tokens: Tensor, encoded: list[Encoded] | None = None, *,
               state: EnsembleState | None = None) -> Tensor:
        """As :meth:`Transformer.decode`, for the ensemble.  tokens [N, T] -> [N, T, V]"""
        if state is None:
            if encoded is None:
                raise ValueError("decode() needs the encoder outputs or a decoding state")
            return self.combine([m.decode(tokens, e) for m, e in zip(self.models, encoded)])
        return self.combine([m.decode(tokens, state=s) for m, s in zip(self.models, state.members)])

    def __call__(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced scores, as a model's forward.  src [B, S], tgt_in [B, T] -> [B, T, V]"""
        return self.combine([model(src, tgt_in) for model in self.models])


def members(model: Transformer | Ensemble) -> list[Transformer]:
    """The models behind ``model``: itself, or an ensemble's members."""
    return model.models if isinstance(model, Ensemble) else [model]


def position_limit(model: Transformer | Ensemble) -> int | None:
    """The most output tokens before the end symbol that every member's learned
    positions reach (None when no member has learned positions)."""
    limits = [limit - 1 for m in members(model) if (limit := m.config.position_limit) is not None]
    return min(limits) if limits else None
