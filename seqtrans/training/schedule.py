"""The learning-rate schedule of section 5.3: linear warm-up, then inverse square root."""

from __future__ import annotations


def inverse_sqrt_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
