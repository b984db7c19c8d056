"""Decoding copies of a model: :func:`quantized` for int8 decoding
(``decode.precision=int8``), whose linear layers are :class:`~seqtrans.linear.int8.Int8Linear`,
and :func:`onednn` for float32 decoding on CPU, whose linear layers multiply through
oneDNN (:class:`~seqtrans.linear.onednn.OneDNNLinear`). A copy shares the model's tensors
and never writes them; the model itself is left as it is. :func:`quantized_cached` and
:func:`onednn_cached` keep a copy while the model's parameters are unchanged.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable

from torch import Tensor, nn

from seqtrans.errors import ConfigError
from seqtrans.linear.int8 import Int8Linear
from seqtrans.linear.onednn import OneDNNLinear
from seqtrans.model import Transformer


def _with_linears(model: Transformer, make: Callable[[Tensor, Tensor | None], nn.Module]) -> Transformer:
    """A copy of ``model`` whose every ``nn.Linear`` (and output projection) is
    ``make(weight, bias)``; it shares the model's tensors and never writes them."""
    # deepcopy with every parameter and buffer in the memo copies the modules, not the tensors
    memo: dict[int, object] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, memo)
    made: dict[int, nn.Module] = {}  # a layer shared by several modules is made once
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if id(child) not in made:
                    made[id(child)] = make(child.weight, child.bias)
                setattr(parent, name, made[id(child)])
    twin.projection = make(model.output_weight, None)
    return twin.eval()


def quantized(model: Transformer) -> Transformer:
    """A copy of ``model`` for int8 decoding on CPU: every ``nn.Linear`` becomes an
    :class:`Int8Linear`, and the output projection too (with tied embeddings it quantizes
    a copy of the embedding matrix; the embedding lookup stays float32). The copy shares
    the model's float tensors and never writes them; the model is unchanged."""
    device = model.output_weight.device
    model.check_supported("quantize")
    if device.type != "cpu":
        raise ConfigError("decode.precision", f"int8 decodes on CPU only, not on {device.type}; "
                          "use fp32 or bf16 there")
    return _with_linears(model, Int8Linear)


def onednn(model: Transformer) -> Transformer:
    """A copy of ``model`` for float32 decoding on CPU whose linear layers and output
    projection multiply through oneDNN (:class:`OneDNNLinear`); it shares the model's
    tensors. The products round differently from ``F.linear``'s in the last bits, the
    same way in every process on one machine, so decoding stays reproducible."""
    if model.output_weight.device.type != "cpu":
        raise ValueError("oneDNN linear layers are for CPU decoding")
    return _with_linears(model, OneDNNLinear)


# model -> kind -> (the state its copy was made from, the copy); weak, so a model dropped is forgotten
_Versions = tuple[tuple[int, int], ...]
_copies: weakref.WeakKeyDictionary[Transformer, dict[str, tuple[_Versions, Transformer]]] = (
    weakref.WeakKeyDictionary())


def _cached(model: Transformer, kind: str, make: Callable[[Transformer], Transformer]) -> Transformer:
    """``make(model)``, made again only when the model's parameters have changed since
    (an optimizer step or ``load_state_dict`` writes them in place, which bumps their
    version counters), so that decoding line after line makes it once."""
    state = tuple((id(p), p._version) for p in itertools.chain(model.parameters(), model.buffers()))
    kept = _copies.setdefault(model, {})
    hit = kept.get(kind)
    if hit is not None and hit[0] == state:
        return hit[1]
    twin = make(model)
    kept[kind] = (state, twin)
    return twin


def quantized_cached(model: Transformer) -> Transformer:
    """:func:`quantized`, kept while the model's parameters are unchanged."""
    return _cached(model, "int8", quantized)


def onednn_cached(model: Transformer) -> Transformer:
    """:func:`onednn`, kept while the model's parameters are unchanged."""
    return _cached(model, "onednn", onednn)
