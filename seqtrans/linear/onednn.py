"""float32 linear layers that multiply through oneDNN instead of the BLAS behind
``F.linear``, for float32 decoding on CPU.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear operator (x86 and ARM builds have it)."""
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OneDNNLinear(nn.Module):
    """``y = x @ W.T + b`` through oneDNN's matrix multiply, for float32 decoding on CPU.

    PyTorch's ``F.linear`` calls the BLAS it was built with (Intel MKL in the x86 wheels),
    which on AMD processors runs well below oneDNN's speed for the same product
    (docs/speed.md). ``weight`` and ``bias`` are the tensors it was made from, shared;
    no gradient flows through the layer. ``forward(x [..., K]) -> [..., O]``.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias

    @property
    def in_features(self) -> int:
        return self.weight.size(1)

    @property
    def out_features(self) -> int:
        return self.weight.size(0)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
