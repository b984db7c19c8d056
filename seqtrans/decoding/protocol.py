"""What the search loops need of a model: encode once, start a state, decode a step.

A :class:`~seqtrans.model.transformer.Transformer` is one; so is an
:class:`~seqtrans.decoding.ensemble.Ensemble` of several, and so are the probability tables of the tests.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor


class SearchState(Protocol):
    """The decoding state a search step updates and a search reorders. A state whose
    model scores only some target ids (a vocabulary shortlist) also has ``columns``, the
    ids of decode's columns [V'], and ``vocabulary_size``; the search then works in those
    columns (:class:`~seqtrans.decoding.search.Columns`)."""

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep hypotheses ``rows`` [N'] and sentences ``sentences`` [B']."""
        ...


class SearchModel(Protocol):
    """A model the search loops can decode with (:mod:`seqtrans.decoding.beam`)."""

    def eval(self) -> Any: ...

    def encode(self, src: Tensor) -> Any:
        """What ``start`` needs of the sources src [B, S]."""
        ...

    def start(self, encoded: Any, *, beam: int = 1, capacity: int = 64) -> Any:
        """A fresh :class:`SearchState` for ``beam`` hypotheses per source."""
        ...

    def decode(self, tokens: Tensor, encoded: Any = None, *, state: Any = None) -> Tensor:
        """Next-token scores whose log-softmax is the model's log-probability.  [N, T] -> [N, T, V]"""
        ...


def decode_rows(model: SearchModel, tokens: Tensor, rows: Tensor, state: Any) -> Tensor:
    """Read ``tokens`` [N, T] into ``state`` for every hypothesis, and score the next token of
    the hypotheses ``rows`` [R] alone: a model's ``decode_rows`` where it has one (a
    Transformer's output product over those rows only), else its ``decode``'s rows. Each
    row's scores are those ``decode`` gives it.  -> [R, T, V]"""
    step = getattr(model, "decode_rows", None)
    if step is not None:
        return step(tokens, rows, state=state)
    return model.decode(tokens, state=state)[rows]


def advance(model: SearchModel, tokens: Tensor, state: Any) -> None:
    """Read ``tokens`` [N, T] into ``state`` without scoring what follows them: a model's
    ``advance`` where it has one (a Transformer runs its decoder and skips the output
    product, most of a large vocabulary's step), else its ``decode``, whose scores are
    dropped."""
    step = getattr(model, "advance", None)
    if step is not None:
        step(tokens, state=state)
    else:
        model.decode(tokens, state=state)
