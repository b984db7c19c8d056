"""The normalisations of the residual stream (``model.norm_kind``): the paper's LayerNorm,
or RMSNorm (Zhang and Sennrich 2019), which rescales by the root mean square alone, with
no mean subtracted and no bias, as Raffel et al. (2020) use it.

Shapes: D model width; any leading dimensions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension.  [..., D] -> [..., D]

    The mean of squares is taken in float32 whatever the input's type, as Raffel et al.'s
    implementation does, so that bfloat16 activations do not lose it."""

    def __init__(self, d_model: int, *, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))  # [D]
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype == torch.float32:
            # PyTorch's operator computes the same arithmetic, bit for bit, as one call instead of
            # seven (a decoding step of T5 normalises three times a layer)
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        variance = x.float().pow(2).mean(-1, keepdim=True)  # [..., 1]
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


def make_norm(kind: str, d_model: int, *, eps: float) -> nn.Module:
    """A normalisation over ``d_model`` features: ``kind`` 'layer' (LayerNorm) or 'rms'."""
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps)
    raise ValueError(f"no normalisation '{kind}'; known: layer, rms")
