"""Dropout whose CPU mask costs a quarter of the random numbers.

``torch.nn.functional.dropout`` on the CPU draws one Bernoulli sample per element
through the generic distribution code, which can cost more than the matrix product
before it (measurements in docs/speed.md). Here one 64-bit draw of the default generator
gives four independent 16-bit uniforms; an element is kept when its uniform is at least
``round(p * 2**16)``, and the kept ones are scaled by
``2**16 / (2**16 - round(p * 2**16))``, so the output's expectation is exactly the
input's. The drop rate is ``p`` rounded to a multiple of 2**-16 (at most 7.6e-6 off).
Only the boolean mask is kept for the backward pass, as ``F.dropout`` does.

On other devices, for p = 0 or 1, and in evaluation mode this is ``F.dropout``.
Seeding ``torch.manual_seed`` makes the masks reproducible, as it does for ``F.dropout``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, *,
              device: torch.device | str = "cpu") -> tuple[Tensor, float]:
    """A boolean mask (True = kept) with drop rate ``p`` (to 2**-16) and the kept ones' scale."""
    dropped = round(p * _LEVELS)
    numel = math.prod(shape)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(1 << 63), None)  # every bit uniform
    uniform = words.view(torch.int16)[:numel].view(shape)  # [-2**15, 2**15)
    return uniform >= dropped - _LEVELS // 2, _LEVELS / (_LEVELS - dropped)


class _Masked(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)`` with the cheaper mask on the CPU."""
    if (not training or p == 0.0) and 0.0 <= p <= 1.0:
        return x  # what F.dropout gives then, without its call at every step of decoding
    if p >= 1.0 or x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, training)
    keep, scale = keep_mask(x.shape, p, device=x.device)
    return _Masked.apply(x, keep, scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` through :func:`dropout` (no parameters: checkpoints are unchanged)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
