"""The constraint hook: a task restricts, per hypothesis, which tokens may come next.

Shapes: N hypotheses (sentences x beam), t tokens so far, V target vocabulary.
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


def apply_constraint(log_probs: Tensor, constraint: Constraint | None, prefix: Tensor, *,
                     rows: Tensor, remaining: Tensor) -> Tensor:
    """Set the log-probability of tokens the constraint forbids to -inf.  [N, V] -> [N, V]"""
    if constraint is None:
        return log_probs
    mask = constraint.allowed(prefix, rows=rows, remaining=remaining)
    if mask.shape != log_probs.shape or mask.dtype != torch.bool:
        raise TypeError(
            f"{type(constraint).__name__}.allowed returned {tuple(mask.shape)} {mask.dtype}; "
            f"expected a bool mask of shape {tuple(log_probs.shape)}"
        )
    return log_probs.masked_fill(~mask.to(log_probs.device), float("-inf"))
