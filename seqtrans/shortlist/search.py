"""Search with a vocabulary shortlist (``decode.shortlist``): the output projection is
computed only over the target tokens that some source of the batch may produce
(:class:`seqtrans.shortlist.table.Shortlist`), and each hypothesis is restricted to those of
its own source.

:class:`Shortlisted` offers the search loops what a model does
(:class:`~seqtrans.decoding.protocol.SearchModel`). Its ``decode`` returns
log-probabilities over the batch's shortlist only (-inf outside each source's own, each
source's softmax taken over its own tokens at positions that do not depend on its batch:
:func:`own_log_softmax`), and its state names the target ids of those columns
(``columns``), so that beam search and greedy search rank and choose among them alone
and map the columns they pick back to target ids
(:class:`~seqtrans.decoding.search.Columns`); the length rules, prefixes, banned phrases
and a task's constraint are read at those columns. What it saves is the
product with the vocabulary-sized weight, the largest one of a small decoder's step, and
the search's passes over the whole vocabulary (the softmax, the top-k): on a 256-wide
student with 8,000 pieces these cost more than the product (docs/speed.md). Required
phrases, whose search follows them over the whole vocabulary, and sampling, whose draw
sums probabilities in column order (so a batch's columns could move its bits), get
logits over the whole vocabulary (``compact=False``), -inf outside the shortlist. The tokens a sentence may
produce do not depend on the other sentences of its batch; the softmax is taken over them
(as Marian's and CTranslate2's shortlists do), so scores are log-probabilities
renormalised over the shortlist.

Shapes: B sentences, K hypotheses per sentence, N = B*K rows, T tokens of this step,
D d_model, V vocabulary, V' the tokens the batch's projection computes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.linear import RowSelecting, output_projection
from seqtrans.model.transformer import Transformer
from seqtrans.shortlist.table import Shortlist

#: The projection's rows are padded (with a token not allowed) to a multiple of this, so
#: that the products of a run see few distinct shapes (oneDNN caches a kernel per shape).
ROWS_MULTIPLE = 64


@dataclass
class ShortlistEncoded:
    """The model's encoder output, with the batch's projection rows and each source's tokens."""

    inner: Any
    ids: Tensor  # [V'] target ids the projection computes
    allowed: Tensor  # [B, V'] which of them each source may produce
    own: Tensor  # [B, W] each source's allowed columns in order, then V' (see own_columns)


@dataclass
class ShortlistState:
    """The model's decoding state, the projection onto the batch's rows, and which of them
    each hypothesis may produce (reordered with the beam)."""

    inner: Any
    project: Callable[[Tensor], Tensor]
    ids: Tensor  # [V']
    # each hypothesis's columns, reordered with the beam: as a mask [N, V'] for logits over
    # the whole vocabulary, else as its own columns [N, W] (own_columns); only the one used
    allowed: Tensor | None
    own: Tensor | None
    vocabulary_size: int  # V
    compact: bool  # decode's log-probabilities over the V' columns, not logits over the whole vocabulary

    @property
    def columns(self) -> Tensor | None:
        """The target ids of decode's columns [V']; None where they are the whole vocabulary."""
        return self.ids if self.compact else None

    @property
    def normalized(self) -> bool:
        """Whether decode's scores are log-probabilities already (over the columns)."""
        return self.compact

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` [N'] and sentences ``sentences`` [B']."""
        self.inner.reorder(rows, sentences)
        if self.allowed is not None:
            self.allowed = self.allowed.index_select(0, rows)
        if self.own is not None:
            self.own = self.own.index_select(0, rows)


class Shortlisted:
    """``model`` (a Transformer or its decoding copy) searching with ``shortlist``; the
    sources it encodes are the batch whose ``extra`` target ids (per source, e.g. the tokens
    of a forced prefix or of required phrases) are allowed besides the shortlist's. Its
    scores cover the batch's shortlist only (log-probabilities), or with ``compact`` False
    the whole vocabulary (logits)."""

    def __init__(self, model: Transformer, shortlist: Shortlist, *,
                 extra: Sequence[Sequence[int]] | None = None, compact: bool = True) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(f"a shortlist restricts one Transformer's projection, not a "
                            f"{type(model).__name__}")
        self.model = model
        self.shortlist = shortlist
        self.extra = extra
        self.compact = compact

    def eval(self) -> Shortlisted:
        self.model.eval()
        return self

    def encode(self, src: Tensor) -> ShortlistEncoded:
        """src [B, S] -> the encoder output with the batch's shortlist."""
        ids, allowed = batch_rows(self.shortlist, src.tolist(), extra=self.extra)
        device = src.device
        own = own_columns(allowed, self.shortlist.target_size)
        return ShortlistEncoded(self.model.encode(src), torch.from_numpy(ids).to(device),
                                torch.from_numpy(allowed).to(device), torch.from_numpy(own).to(device))

    def start(self, encoded: ShortlistEncoded, *, beam: int = 1, capacity: int = 64) -> ShortlistState:
        inner = self.model.start(encoded.inner, beam=beam, capacity=capacity)
        # [B, V'] -> [N, V'], [B, W] -> [N, W]
        allowed = None if self.compact else encoded.allowed.repeat_interleave(beam, dim=0)
        own = encoded.own.repeat_interleave(beam, dim=0) if self.compact else None
        return ShortlistState(inner, output_rows(self.model, encoded.ids), encoded.ids, allowed, own,
                              vocabulary_size=self.shortlist.target_size, compact=self.compact)

    def advance(self, tokens: Tensor, *, state: ShortlistState) -> None:
        """Read ``tokens`` [N, T] into the state without scoring them
        (:func:`seqtrans.decoding.protocol.advance`)."""
        self.model.decode_hidden(tokens, state=state.inner)

    def decode(self, tokens: Tensor, encoded: Any = None, *, state: ShortlistState | None = None) -> Tensor:
        """Next-token log-probabilities over the batch's shortlist (the state's ``columns``),
        or with ``compact`` False logits over the whole vocabulary; -inf outside each
        hypothesis's shortlist.  tokens [N, T] -> [N, T, V'] (or [N, T, V])"""
        if state is None:
            raise ValueError("a shortlisted model decodes step by step, with a decoding state")
        hidden = self.model.decode_hidden(tokens, state=state.inner)  # [N, T, D]
        logits = state.project(hidden)  # [N, T, V']
        if state.own is not None:  # compact: a row's own columns are its allowed ones, the rest -inf
            return own_log_softmax(logits, state.own)
        assert state.allowed is not None
        logits = logits.masked_fill(~state.allowed.unsqueeze(1), float("-inf"))
        size = self.shortlist.target_size
        full = logits.new_full((*logits.shape[:-1], size), float("-inf"))  # [N, T, V]
        # the padding rows repeat a token no hypothesis may produce: each writes -inf there
        return full.index_copy_(-1, state.ids, logits)


def own_columns(allowed: np.ndarray, vocabulary: int) -> np.ndarray:
    """Each source's allowed columns in order, left-aligned, then the column V' (one past
    the last) to a common width W: the longest row rounded up to :data:`ROWS_MULTIPLE`,
    at most ``vocabulary``. A source's own columns then sit at the same positions
    whatever its batch, and the padding at positions past them, so that its softmax sees
    the same values at the same places alone as in any batch (the same bits: float sums
    and vectorized functions depend on positions).  allowed [B, V'] bool -> [B, W] int64"""
    counts = allowed.sum(axis=1)
    longest = int(counts.max()) if len(counts) else 0
    width = max(1, min(-(-longest // ROWS_MULTIPLE) * ROWS_MULTIPLE, vocabulary))
    own = np.full((allowed.shape[0], width), allowed.shape[1], dtype=np.int64)
    for b, row in enumerate(allowed):
        cols = np.flatnonzero(row)
        own[b, : len(cols)] = cols
    return own


def own_log_softmax(logits: Tensor, own: Tensor) -> Tensor:
    """The log-softmax of each row over its own columns ``own`` [N, W] (from
    :func:`own_columns`), taken in that left-aligned layout and put back in the batch's
    columns; -inf elsewhere.  logits [N, T, V'] -> [N, T, V'] float32"""
    n, t, width = logits.shape
    index = own.unsqueeze(1).expand(n, t, own.size(1))  # [N, T, W]
    padded = F.pad(logits.float(), (0, 1), value=float("-inf"))  # [N, T, V'+1]: column V' is -inf
    normalized = torch.log_softmax(padded.gather(-1, index), dim=-1)  # [N, T, W]
    out = torch.full_like(padded, float("-inf")).scatter_(-1, index, normalized)
    return out[..., :width]


def output_rows(model: Transformer, ids: Tensor) -> Callable[[Tensor], Tensor]:
    """``model``'s output projection onto the target tokens ``ids`` [V'] only, in the form
    its ``decode`` projects with (a decoding copy's int8 or oneDNN layer, else float32), its
    bias included: ``decode``'s logits at those columns, to float rounding.
    hidden [N, T, D] -> [N, T, V']"""
    bias = None if model.output_bias is None else model.output_bias[ids]
    if model.projection_adds_bias:
        bias = None  # the rows' layer adds theirs (the same bits)
    if model.projection is not None:
        if not isinstance(model.projection, RowSelecting):
            raise TypeError(f"{type(model.projection).__name__} cannot select output rows")
        layer: Callable[[Tensor], Tensor] = model.projection.rows(ids)
    else:
        weight = model.output_weight[ids]  # [V', D]

        def layer(hidden: Tensor) -> Tensor:
            return output_projection(hidden, weight)

    def project(hidden: Tensor) -> Tensor:
        logits = layer(hidden)
        return logits if bias is None else logits + bias.to(logits.dtype)

    return project


def batch_rows(shortlist: Shortlist, sources: Sequence[Sequence[int]], *,
               extra: Sequence[Sequence[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The target ids the projection of a batch computes [V'] (every token some source may
    produce, padded to a multiple of :data:`ROWS_MULTIPLE` within the vocabulary by a token
    none may produce)
    and which of them each source may produce [B, V'] bool."""
    allowed = shortlist.allowed(sources)  # [B, V]
    if extra is not None:
        for b, tokens in enumerate(extra):
            allowed[b, [t for t in tokens if 0 <= t < allowed.shape[1]]] = True
    union = allowed.any(axis=0)  # [V]
    ids = np.flatnonzero(union)  # [V'] ascending
    used = len(ids)
    padded = min(-(-used // ROWS_MULTIPLE) * ROWS_MULTIPLE, shortlist.target_size)
    if padded > used:  # padded with a token no source of the batch allows
        ids = np.concatenate([ids, np.full(padded - used, np.flatnonzero(~union)[0], dtype=ids.dtype)])
    rows = allowed[:, ids]  # [B, V']
    rows[:, used:] = False
    return ids.astype(np.int64), rows
