"""float32 linear layers that multiply through oneDNN instead of the BLAS behind
``F.linear``, for float32 decoding on CPU.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqtrans.runtime import environment
from seqtrans.runtime.system import release_mapped


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear operator (x86 and ARM builds have it)."""
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OneDNNLinear(nn.Module):
    """``y = x @ W.T + b`` through oneDNN's matrix multiply, for float32 decoding on CPU.

    PyTorch's ``F.linear`` calls the BLAS it was built with (Intel MKL in the x86 wheels),
    which on AMD processors runs well below oneDNN's speed for the same product
    (benchmarks/README.md). ``weight`` and ``bias`` are the tensors it was made from, shared;
    no gradient flows through the layer. ``forward(x [..., K]) -> [..., O]``.

    The product reads a copy of the weight in oneDNN's own blocked layout
    (:func:`packed`), made once with the layer: with the weight in its plain layout
    oneDNN rearranges it at every call, which made a decoding step's few rows take twice
    as long (docs/speed.md, "Packed float32 weights"). The copy costs the weight's memory
    again, for as long as the layer lives; ``SEQTRANS_PACK_WEIGHTS=0`` (read when the
    layer is made) keeps none. Either way a row gets the same bits alone as in any batch,
    with any number of threads (tests/linear/test_onednn.py).

    oneDNN builds and caches a primitive for every row count it sees. Decoding sees
    thousands (batch rows x source lengths, beams shrinking as sentences end), which
    churns that cache and leaves the process's memory growing with every new shape, so
    the rows are padded up to :func:`row_bucket`'s few sizes. A single row is padded
    to two: oneDNN multiplies one row with a matrix-vector kernel that sums in another
    order, and a row must get the same bits alone as in a batch.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self._packed = packed(weight)

    @property
    def in_features(self) -> int:
        return self.weight.size(1)

    @property
    def out_features(self) -> int:
        return self.weight.size(0)

    @property
    def packed_weight(self) -> Tensor:
        """The weight as the product reads it: oneDNN's blocked copy, or the weight itself
        where none was made (:func:`packed`)."""
        return self._packed

    def rows(self, ids: Tensor) -> OneDNNLinear:
        """The layer of the output rows ``ids`` [O'] only (their weights copied), for a
        product restricted to them (a vocabulary shortlist)."""
        return OneDNNLinear(self.weight[ids].contiguous(), None if self.bias is None else self.bias[ids])

    #: ``forward(x, relu=True)`` applies max(0, .) as the product's own last step
    #: (seqtrans.model.layers.FeedForward): the same values, one pass over them fewer
    fuses_relu = True

    def forward(self, x: Tensor, *, relu: bool = False) -> Tensor:
        # A decoding step's products are small, so each operator called from Python around one
        # is a sizeable share of its time: the operator is given x as it comes (it flattens
        # the leading dims itself) wherever no padding is needed.
        post = "relu" if relu else "none"
        lead = x.shape[:-1]
        m = math.prod(lead)
        padded = row_bucket(m)
        if padded == m:
            return _product(x, self._packed, self.bias, post)  # [..., O]
        if m == 1 and x.dim() > 1:
            # the row twice, contiguous: the operator copies a strided view itself, more slowly
            return _product(torch.cat([x, x]), self._packed, self.bias, post)[:1]  # [1, ..., O]
        rows = x.reshape(m, x.size(-1))  # [M, K]
        rows = torch.cat([rows, rows.new_zeros(padded - m, rows.size(1))])  # [M', K]
        y = _product(rows, self._packed, self.bias, post)  # [M', O]
        return y[:m].view(*lead, y.size(1))


def _product(x: Tensor, weight: Tensor, bias: Tensor | None, post: str) -> Tensor:
    """oneDNN's ``x @ weight.T + bias``, then ``post`` ("relu" or "none").  [..., K] -> [..., O]"""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post, [], "")


#: The built products of distinct shapes ``seqtrans serve`` keeps (:func:`bound_primitive_caches`).
SERVER_PRIMITIVES = 128


def bound_primitive_caches(entries: int) -> dict[str, str]:
    """Have PyTorch's cache of built oneDNN products and oneDNN's own keep at most
    ``entries`` each, where the environment does not set them
    (:data:`~seqtrans.runtime.environment.PRIMITIVE_CACHES`); returns the capacities in force.

    Each product of a new shape (a weight's shape and a padded row count) is built once,
    its kernels compiled for it, and both caches keep it: about half a MiB, for up to 1,024
    shapes each by default. A server meets new row counts for as long as it runs (batches,
    beams, n-best lists and scores of every size), so its memory grew by that much again
    with each until the caches filled (docs/serving-load.md, "Memory under a mixed load").
    Both read their capacity once, when the first product is built: call this before."""
    for name in environment.PRIMITIVE_CACHES:
        if not environment.primitive_cache_capacity(name):
            environment.export(name, str(entries))
    return {name: environment.primitive_cache_capacity(name) for name in environment.PRIMITIVE_CACHES}


def row_bucket(m: int) -> int:
    """The row count a product of ``m`` rows runs at: ``m`` itself from 2 to 16 (2 for
    1), then the next multiple of 1/8 of the power of two below it (eight sizes per
    doubling, at most 1/8 more rows)."""
    if m <= 16:
        return max(m, 2)
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


def packed(weight: Tensor) -> Tensor:
    """A copy of ``weight`` [O, K] float32 in the blocked layout oneDNN's product reads
    fastest on this processor (an opaque ``torch._mkldnn`` tensor that only
    ``_linear_pointwise`` reads), or ``weight`` itself where this PyTorch cannot make one
    or ``SEQTRANS_PACK_WEIGHTS=0`` says not to. A weight read from a map of its file
    (a run loaded for decoding) gives its pages back once copied
    (:func:`seqtrans.runtime.system.release_mapped`): the weights are then in memory once,
    in the packed layout."""
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if (reorder is None or weight.dtype != torch.float32 or weight.device.type != "cpu"
            or not environment.pack_weights()):
        return weight
    try:
        with torch.no_grad():
            copy = reorder(weight.detach())
    except RuntimeError:  # a layout oneDNN does not take: the plain product, still the same for every batch
        return weight
    # the product reads the copy alone: a weight loaded as a map of its file need not stay resident
    release_mapped(weight)
    return copy
