"""Decoding copies of a model: :func:`quantized` for int8 decoding
(``decode.precision=int8``), whose linear layers are :class:`~seqtrans.linear.int8.Int8Linear`,
and :func:`onednn` for float32 decoding on CPU, whose linear layers multiply through
oneDNN (:class:`~seqtrans.linear.onednn.OneDNNLinear`). A copy shares the model's tensors
and never writes them; the model itself is left as it is. :func:`quantized_cached` and
:func:`onednn_cached` keep a copy while the model's parameters are unchanged.
:func:`int8_only` makes the int8 model a run loads as with ``decode.precision=int8``,
which keeps no float weights (its embedding tables in int8 too).
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable
from functools import partial

from torch import Tensor, nn

from seqtrans.errors import ConfigError
from seqtrans.linear.int8 import Int8Embedding, Int8Linear
from seqtrans.linear.native_step import native_step
from seqtrans.linear.onednn import FileEmbedding, OneDNNLinear
from seqtrans.model.norms import native_layer_norms
from seqtrans.model.transformer import Transformer


def _with_linears(model: Transformer, make: Callable[[Tensor, Tensor | None], nn.Module], *,
                  projection: bool = True, in_place: bool = False) -> Transformer:
    """A copy of ``model`` whose every ``nn.Linear`` (and, with ``projection``, output
    projection) is ``make(weight, bias)``; it shares the model's other tensors and never
    writes them. ``in_place``: change ``model`` itself, each float layer let go as soon as
    it is replaced (so that its weight can be freed then)."""
    if in_place:
        twin = model
    else:
        # deepcopy with every parameter and buffer in the memo copies the modules, not the tensors
        memo: dict[int, object] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
        twin = copy.deepcopy(model, memo)
    # a layer of the same tensors, shared by several modules or the untied output layer, is made once
    made: dict[tuple[int, int], nn.Module] = {}
    if projection:  # first: the largest layer, made while nothing else is
        twin.projection = made[id(model.output_weight), id(None)] = make(model.output_weight, None)
    # the parents only: a list of every module would keep each float layer alive to the end
    for parent in [m for m in twin.modules() if not isinstance(m, nn.Linear)]:
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                key = id(child.weight), id(child.bias)
                if key not in made:
                    made[key] = make(child.weight, child.bias)
                setattr(parent, name, made[key])
    return twin.eval()


def quantized(model: Transformer) -> Transformer:
    """A copy of ``model`` for int8 decoding on CPU: every ``nn.Linear`` becomes an
    :class:`Int8Linear`, and the output projection too (with tied embeddings it quantizes
    a copy of the embedding matrix; the embedding lookup stays float32). The copy shares
    the model's float tensors and never writes them; the model is unchanged. A model
    made by :func:`int8_only` is its own int8 copy."""
    if is_int8_only(model):
        return model
    check_int8(model)
    return _with_native_step(_bias_in_projection(_with_linears(model, Int8Linear), model.output_bias),
                             layer_norms=True)


def int8_only(model: Transformer, *, in_place: bool = False) -> Transformer:
    """A model for int8 decoding on CPU that keeps no float copy of its weights: as
    :func:`quantized`, and the embedding tables in int8 too (:class:`Int8Embedding`, the
    tied output projection sharing the target table's rows), so that once ``model`` is
    dropped only the int8 weights (and the small float ones: biases, LayerNorms) stay in
    memory, about a quarter of the float model. What ``decode.precision=int8`` loads
    (:func:`seqtrans.inference.loading.load`, ``in_place``: ``model`` itself becomes the
    int8 model, each float weight freed as it is replaced); it decodes in int8 only."""
    check_int8(model)
    tied, shared = model.output is None, model.source_embed is model.target_embed
    twin = _with_linears(model, partial(Int8Linear, keep_float=False), projection=False, in_place=in_place)
    table = Int8Embedding(twin.target_embed.weight, release=in_place)
    source = table if shared else Int8Embedding(twin.source_embed.weight, release=in_place)
    twin.target_embed, twin.source_embed = table, source  # type: ignore[assignment]
    if tied:  # the projection is the target table, rows shared
        twin.projection = Int8Linear(None, rows=(table.qweight, table.scale.unsqueeze(1)))
    else:
        twin.projection, twin.output = twin.output, None
    return _with_native_step(_bias_in_projection(twin, twin.output_bias), layer_norms=True)


def _bias_in_projection(twin: Transformer, bias: Tensor | None) -> Transformer:
    """``twin`` with its output projection adding the output ``bias`` as the product's own last
    step, with the same bits (each layer's ``plus_bias``): a pass over a large vocabulary's
    logits fewer at every step. An ``Int8Linear`` or ``OneDNNLinear`` projection."""
    if bias is not None and isinstance(twin.projection, (Int8Linear, OneDNNLinear)):
        twin.projection = twin.projection.plus_bias(bias.detach())
    return twin


def _with_native_step(twin: Transformer, *, layer_norms: bool = False) -> Transformer:
    """``twin`` (int8, or float32 through oneDNN) with its decoder's layers in one native call per step where
    :func:`seqtrans.linear.native_step.native_step` covers them (the same bits). ``layer_norms``
    (the int8 copies): its LayerNorms first made native ones
    (:class:`~seqtrans.model.norms.NativeLayerNorm`), which the step can call for the same
    bits; int8 decoding is not F.layer_norm's bits anyway, while float32 decoding keeps them."""
    if layer_norms:
        native_layer_norms(twin)
    twin.native_step = native_step(twin.decoder_layers, twin.decoder_norm, twin.output_scale)
    return twin


def is_int8_only(model: object) -> bool:
    """Whether ``model`` was made by :func:`int8_only` (it has no float weights to decode with)."""
    return isinstance(getattr(model, "target_embed", None), Int8Embedding)


def check_int8(model: Transformer) -> None:
    """A :class:`ConfigError` naming ``decode.precision`` where ``model`` cannot decode in int8."""
    device = model.device
    model.check_supported("quantize")
    if device.type != "cpu":
        raise ConfigError("decode.precision", f"int8 decodes on CPU only, not on {device.type}; "
                          "use fp32 or bf16 there")


def onednn(model: Transformer) -> Transformer:
    """A copy of ``model`` for float32 decoding on CPU whose linear layers and output
    projection multiply through oneDNN (:class:`OneDNNLinear`), the output bias added by the
    projection's own product (``projection_adds_bias``); it shares the model's tensors. The
    products round differently from ``F.linear``'s in the last bits, the same way in every
    process on one machine, so decoding stays reproducible. Where the projection is the
    target embeddings (tied) and packing gave the table's pages back (a map of its file),
    the copy looks embeddings up from the file (:class:`FileEmbedding`), so that the table
    stays resident once, as the projection's packed copy."""
    if model.device.type != "cpu":
        raise ValueError("oneDNN linear layers are for CPU decoding")
    twin = _with_linears(model, OneDNNLinear)
    projection = twin.projection
    if model.output is None and isinstance(projection, OneDNNLinear) and projection.file_rows is not None:
        table = FileEmbedding(projection.file_rows)
        if twin.source_embed is twin.target_embed:
            twin.source_embed = table  # type: ignore[assignment]
        twin.target_embed = table  # type: ignore[assignment]
    return _with_native_step(_bias_in_projection(twin, model.output_bias))


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
    if is_int8_only(model):
        return model  # (not cached: the cache's value would keep its own key alive)
    return _cached(model, "int8", quantized)


def onednn_cached(model: Transformer) -> Transformer:
    """:func:`onednn`, kept while the model's parameters are unchanged."""
    return _cached(model, "onednn", onednn)
