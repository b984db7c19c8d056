"""The three ways seqtrans multiplies by a weight matrix when it decodes, one module each:

- :mod:`.fp32`: float32 through the BLAS behind ``F.linear``; the output projection in
  the form its shape runs fastest in (:func:`~.fp32.output_projection`, what
  :class:`~seqtrans.model.transformer.Transformer` calls; training, CUDA and other dtypes get
  ``F.linear``);
- :mod:`.onednn`: float32 through oneDNN (:class:`~.onednn.OneDNNLinear`), the layers of
  the fp32 decoding copy on CPU;
- :mod:`.int8`: int8 weights and activations (:class:`~.int8.Int8Linear`), the layers of
  the int8 decoding copy (``decode.precision=int8``).

:mod:`seqtrans.linear.quantize` builds the decoding copies of a model from the last two.

Each of the decoding copies' layers can also give the layer of some of its output rows
(``rows(ids)``, :class:`RowSelecting`): the output projection restricted to a vocabulary
shortlist (``decode.shortlist``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from seqtrans.linear.fp32 import output_projection
from seqtrans.linear.int8 import Int8Linear
from seqtrans.linear.onednn import OneDNNLinear, onednn_available


@runtime_checkable
class RowSelecting(Protocol):
    """A linear layer that gives the layer of some of its output rows."""

    def rows(self, ids: Tensor) -> nn.Module:
        """The layer computing only the outputs ``ids`` [O'] (in that order).  [..., K] -> [..., O']"""
        ...


__all__ = ["Int8Linear", "OneDNNLinear", "RowSelecting", "onednn_available", "output_projection"]
