"""Inference-time choice among equivalent formulations of ``x @ W.T + b``.

Decoding multiplies skinny activations (one row per hypothesis) by large weight
matrices. CPU BLAS libraries are far from equally fast on the equivalent forms
``x @ W.T``, ``(W @ x.T).T`` and ``x @ W_T`` (W_T a contiguous transposed copy of W):
on a 2-core AVX2 machine with MKL, a base model's 37,000-word output projection runs
2-2.6x faster in the best form than in ``F.linear``'s for 1-32 rows. So at inference
time on the CPU, :func:`linear` times the forms once per shape (rows, in, out) and
keeps the fastest for the rest of the process, like cuDNN's benchmark mode. During
training, on CUDA, for other dtypes, or when disabled (``SEQTRANS_TUNE_MATMUL=0``) it
is ``F.linear``. The forms agree up to floating-point rounding in the last bits.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

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


class MatmulTuner:
    """Remembers, per (M, K, O, bias, copy allowed), the fastest form of the product."""

    def __init__(self) -> None:
        self._choice: dict[tuple[int, int, int, bool, bool], _Form] = {}
        self._transposed = _TransposedCopies()

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None = None, *,
                 allow_copy: bool = False) -> Tensor:
        """x [..., K] -> [..., O]; ``allow_copy`` offers a transposed copy of the weight."""
        if (x.device.type != "cpu" or x.dtype != torch.float32 or torch.is_grad_enabled()
                or os.environ.get("SEQTRANS_TUNE_MATMUL", "1") == "0"):
            return F.linear(x, weight, bias)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))  # [M, K]
        key = (x2.size(0), x2.size(1), weight.size(0), bias is not None, allow_copy)
        form = self._choice.get(key)
        if form is None:
            forms = [_plain, _weight_first] + ([self._transposed] if allow_copy else [])
            form = self._choice[key] = _fastest(forms, x2, weight, bias)
        return form(x2, weight, bias).reshape(*lead, weight.size(0))


def _fastest(forms: Sequence[_Form], x: Tensor, w: Tensor, b: Tensor | None) -> _Form:
    best, best_time = forms[0], float("inf")
    for form in forms:
        form(x, w, b)  # warm-up; makes the transposed copy once
        start = time.perf_counter()
        for _ in range(3):
            form(x, w, b)
        elapsed = time.perf_counter() - start
        if elapsed < best_time:
            best, best_time = form, elapsed
    return best


#: The process's tuner: its memo is a cache of measurements, not configuration.
linear = MatmulTuner()


class Linear(nn.Linear):
    """``nn.Linear`` whose inference on the CPU goes through :data:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast context of a ``train.precision`` / ``decode.precision`` setting:
    bfloat16 for ``"bf16"``, disabled for ``"fp32"``."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
