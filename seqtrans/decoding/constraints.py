"""The constraint hook: a task restricts, per hypothesis, which tokens may come next.

A constraint reads each hypothesis's whole prefix at every step (:class:`Constraint`),
or keeps a state per hypothesis that the search updates with each chosen token and
reorders with the beam (:class:`IncrementalConstraint`), which costs the same at every
step instead of growing with the prefix.

Shapes: N hypotheses (sentences x beam), t tokens so far, V target vocabulary,
B' sentences kept.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class Constraint(Protocol):
    """Made by a task for one batch of sources (``Task.constraint``); asked at every step.

    ``allowed`` gets every live hypothesis's prefix ``[N, t]`` (target ids, the start
    symbol excluded), ``rows`` ``[N]`` (which source of the batch each hypothesis
    belongs to) and ``remaining`` ``[N]`` (how many more tokens, the end symbol
    included, the hypothesis may still emit). It returns a bool mask ``[N, V]``,
    True where the token may come next. The search never emits a masked token; a row
    with no allowed token is dropped from the beam.
    """

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor: ...


@runtime_checkable
class ConstraintState(Protocol):
    """A constraint's state for the live hypotheses of one search.

    ``allowed(remaining=)`` is :meth:`Constraint.allowed` for the prefixes the state
    stands for. The search then follows the beam as it does with the decoder state:
    ``reorder(rows, sentences)`` keeps hypotheses ``rows`` [N'] (indices into the
    current ones, in that order) and, when some sentences finished, ``sentences``
    [B'] (indices into the current sentences); ``advance(tokens)`` appends each
    hypothesis's next token [N].
    """

    def allowed(self, *, remaining: Tensor) -> Tensor: ...

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None: ...

    def advance(self, tokens: Tensor) -> None: ...


@runtime_checkable
class IncrementalConstraint(Constraint, Protocol):
    """A constraint that can also keep its state per hypothesis: ``start(rows)`` returns
    the state of empty prefixes, ``rows`` [N] as in :meth:`Constraint.allowed`. The
    state must allow exactly what ``allowed`` allows for the same prefixes."""

    def start(self, rows: Tensor) -> ConstraintState: ...


class PrefixState:
    """The state of a constraint that reads whole prefixes: the prefixes themselves."""

    def __init__(self, constraint: Constraint, rows: Tensor) -> None:
        self.constraint = constraint
        self.rows = rows  # [N] source of each hypothesis
        self.prefix = torch.empty(rows.numel(), 0, dtype=torch.long, device=rows.device)  # [N, t]

    def allowed(self, *, remaining: Tensor) -> Tensor:
        return self.constraint.allowed(self.prefix, rows=self.rows, remaining=remaining)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.rows = self.rows.index_select(0, rows)
        self.prefix = self.prefix.index_select(0, rows)

    def advance(self, tokens: Tensor) -> None:
        self.prefix = torch.cat([self.prefix, tokens.unsqueeze(1)], dim=1)  # [N, t+1]


def start_constraint(constraint: Constraint, rows: Tensor) -> ConstraintState:
    """The state of ``constraint`` for hypotheses of the sources ``rows`` [N], before any token."""
    if isinstance(constraint, IncrementalConstraint):
        return constraint.start(rows)
    return PrefixState(constraint, rows)


def mask_disallowed(log_probs: Tensor, mask: Tensor, *, by: object) -> Tensor:
    """Set the log-probability of tokens ``mask`` forbids to -inf.  [N, V] -> [N, V]"""
    if mask.shape != log_probs.shape or mask.dtype != torch.bool:
        raise TypeError(
            f"{type(by).__name__}.allowed returned {tuple(mask.shape)} {mask.dtype}; "
            f"expected a bool mask of shape {tuple(log_probs.shape)}"
        )
    return log_probs.masked_fill(~mask.to(log_probs.device), float("-inf"))
