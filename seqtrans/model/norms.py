"""The normalisations of the residual stream (``model.norm_kind``): the paper's LayerNorm,
or RMSNorm (Zhang and Sennrich 2019), which rescales by the root mean square alone, with
no mean subtracted and no bias, as Raffel et al. (2020) use it.

Shapes: D model width; any leading dimensions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans import native

#: Widths at or past which a single row's sum may be split between threads by PyTorch (its
#: order then depends on the thread count): those rows keep F.rms_norm.
NATIVE_MAX_WIDTH = 16384
# per width: the vector width in lanes whose summing order gives F.rms_norm's bits, 0 for none
_native_lanes: dict[int, int] = {}


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
            if not torch.is_grad_enabled() and x.device.type == "cpu" and x.stride(-1) == 1:
                lanes = native_lanes(x.size(-1))
                if lanes:
                    # F.rms_norm's bits in one call rather than seven operators, each as long to
                    # call as the pass itself at a decoding step (three norms a layer in T5)
                    return native.rms_norm(x, self.weight, self.eps, lanes=lanes)
            # PyTorch's operator: the same arithmetic, bit for bit, as the formula below
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        variance = x.float().pow(2).mean(-1, keepdim=True)  # [..., 1]
        return self.weight * (x * torch.rsqrt(variance + self.eps)).to(self.weight.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class NativeLayerNorm(nn.Module):
    """A LayerNorm (its weight, bias and eps shared with ``norm``) whose float32 CPU rows,
    without gradients, are normalised by the native kernel (:func:`seqtrans.native.layer_norm`)
    in one call instead of PyTorch's: within float rounding of ``F.layer_norm``, not its
    bits, the same bits for a row in any batch. For decoding copies whose every path uses it
    (the int8 ones, :mod:`seqtrans.linear.quantize`), so that the native decoder step
    (:mod:`seqtrans.linear.native_step`), which calls the same kernel, gives a row the bits
    the layers give it. Elsewhere, and without the kernels, ``F.layer_norm``.  [..., D] -> [..., D]"""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        if norm.weight is None or norm.bias is None or len(norm.normalized_shape) != 1:
            raise ValueError("NativeLayerNorm takes a LayerNorm over the last dimension, with a weight "
                             "and a bias")
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps
        self.normalized_shape = tuple(norm.normalized_shape)

    def forward(self, x: Tensor) -> Tensor:
        if (self.native() and x.dtype == torch.float32 and not torch.is_grad_enabled()
                and x.device.type == "cpu" and x.stride(-1) == 1):
            return native.layer_norm(x, self.weight, self.bias, self.eps)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def native(self) -> bool:
        """Whether float32 CPU rows go through the native kernel here."""
        return (native.available() and self.weight.dtype == self.bias.dtype == torch.float32
                and self.weight.is_contiguous() and self.bias.is_contiguous())

    def extra_repr(self) -> str:
        return f"{self.normalized_shape[0]}, eps={self.eps}, native"


def native_layer_norms(model: nn.Module) -> None:
    """Each ``nn.LayerNorm`` in ``model`` (a decoding copy) made a :class:`NativeLayerNorm`
    of the same tensors, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm and child.weight is not None and child.bias is not None:
                setattr(parent, name, NativeLayerNorm(child))


def native_lanes(width: int) -> int:
    """The vector width in lanes with which the native kernel gives ``F.rms_norm``'s bits for
    rows of ``width`` here, or 0 where it gives them with none (:func:`_lanes_matching`,
    tried once per width)."""
    lanes = _native_lanes.get(width)
    if lanes is None:
        lanes = _native_lanes[width] = _lanes_matching(width)
    return lanes


def _lanes_matching(width: int) -> int:
    """The vector width, tried in turn (8: PyTorch's AVX2 vectors, the one verified; then 16
    and 4, AVX-512's and narrower ones), for which the native kernel gives F.rms_norm's bits
    on random rows of ``width``, or 0 (no kernel here, a width it does not cover, or a
    PyTorch that sums otherwise): tried once per width."""
    if not native.available() or width > NATIVE_MAX_WIDTH:
        return 0
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(5, width, generator=generator) * torch.rand(5, 1, generator=generator) * 8  # [5, D]
    weight = torch.randn(width, generator=generator)  # [D]
    expected = F.rms_norm(rows, (width,), weight, 1e-6)
    for lanes in (8, 16, 4):
        if lanes <= width and torch.equal(native.rms_norm(rows, weight, 1e-6, lanes=lanes), expected):
            return lanes
    return 0


def make_norm(kind: str, d_model: int, *, eps: float) -> nn.Module:
    """A normalisation over ``d_model`` features: ``kind`` 'layer' (LayerNorm) or 'rms'."""
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=eps)
    raise ValueError(f"no normalisation '{kind}'; known: layer, rms")
