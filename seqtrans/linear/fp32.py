"""float32 on the BLAS behind ``F.linear``: the form of ``x @ W.T`` for the output
projection, chosen by shape among equivalent formulations.

Decoding multiplies skinny activations (one row per hypothesis) by the large output
projection. CPU BLAS libraries are far from equally fast on the equivalent forms
``x @ W.T`` (``F.linear``), ``(W @ x.T).T`` and ``x @ W_T`` (W_T a contiguous
transposed copy of W); for the vocabulary-sized projection the best form is several
times faster than ``F.linear``'s for a few rows (docs/speed.md). The forms round
differently in the last bits, so the choice is fixed by the shape alone, never by a
timing: the same model on the same input computes the same bits in every process
(docs/design.md, "Reproducible decoding"). During training, on CUDA, for other dtypes,
or when disabled (``SEQTRANS_TUNE_MATMUL=0``) it is ``F.linear``.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.runtime import environment

_Form = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


def _plain(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return F.linear(x, w, b)


def _weight_first(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """(W @ x.T).T: the large matrix as the left operand.  [M, K] -> [M, O] (a transposed view)"""
    out = w @ x.t()  # [O, M]
    if b is not None:
        out += b.unsqueeze(1)
    return out.t()


class _TransposedCopies:
    """``x @ W_T`` with W_T a contiguous copy of W.T, remade when W changes."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[Tensor], int, Tensor]] = {}

    def __call__(self, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        hit = self._copies.get(id(w))
        if hit is None or hit[0]() is not w or hit[1] != w._version:
            key = id(w)
            hit = (weakref.ref(w, lambda _: self._copies.pop(key, None)), w._version,
                   w.t().contiguous())  # [K, O]
            self._copies[key] = hit
        out = x @ hit[2]  # [M, O]
        return out + b if b is not None else out


_transposed = _TransposedCopies()


def form_for(rows: int) -> _Form:
    """The form of the output projection for ``rows`` rows: a transposed copy of the
    weight for one row, the weight as the left operand for more."""
    return _transposed if rows == 1 else _weight_first


def output_projection(x: Tensor, weight: Tensor) -> Tensor:
    """``x @ weight.T`` for the pre-softmax projection.  x [..., K], weight [O, K] -> [..., O]"""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled()
            or not environment.tune_matmul()):
        return F.linear(x, weight)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.size(-1))  # [M, K]
    return form_for(x2.size(0))(x2, weight, None).reshape(*lead, weight.size(0))


def biased(logits: Tensor, bias: Tensor) -> Tensor:
    """``logits + bias`` [..., O] + [O], the same bits, in place where no gradient needs the
    product (a fresh projection's): a large vocabulary's copy at every decoding step costs a
    pass over it and its new pages."""
    bias = bias.to(logits.dtype)
    return logits + bias if torch.is_grad_enabled() else logits.add_(bias)
