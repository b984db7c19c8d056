"""A CPU decoding copy's whole decoder stack for one new position in one native call
(:func:`seqtrans.native.decoder_step`), where the layers' own forward makes a few dozen
calls a layer from Python, most as long to make as their work at a beam's few rows.

It calls the very kernels the layers call (RMSNorm, or the int8 copies' LayerNorm; the
int8 layers, or the float32 layers' product from oneDNN's packed weight; the attention of
one query per hypothesis over the cache the beam never copies and over the source) with
the same arguments, so a row gets the same bits either way, in any batch. The decoder
(:meth:`seqtrans.model.transformer.Transformer.decode_hidden`) takes whichever of the two
was timed faster for a step's rows and threads in this process, as an int8 layer chooses
its product (:class:`seqtrans.runtime.timing.TimedChoice`).

It covers the layers :func:`native_step` recognises: pre- or post-norm with RMSNorm (T5's
family) or LayerNorm, the model's scaled or unscaled dot-product self- and cross-attention,
a ReLU feed-forward (another feed-forward layer, GELU, SiLU or gated, as the layer computes
it between native sub-layers), a relative position bias; int8 layers
(:func:`seqtrans.linear.quantize.quantized`, ``int8_only``) or float32 ones through oneDNN
(:func:`seqtrans.linear.quantize.onednn`), these up to the rows their own calls multiply
natively. The int8 copies' LayerNorm is seqtrans's own
(:class:`seqtrans.model.norms.NativeLayerNorm`, which those copies use in every path), so
their whole step is one call. A float32 copy keeps PyTorch's LayerNorm, whose bits no
kernel here gives: its step (``segmented``) calls the layers' own norms from Python between
native sub-layers, one call each (:func:`seqtrans.native.decoder_sublayer`); so does a
model whose feed-forward layer no kernel computes, for that layer. A model with anything
else (another attention mechanism; a task's extension of a layer), and a step it does not
cover (several positions at once, a wait-k lag, a source still arriving), keeps the
layers' own path.

``SEQTRANS_NATIVE_STEP=0`` turns it off (:func:`seqtrans.runtime.environment.native_step`).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans import native
from seqtrans.attention.cache import BeamKVCache
from seqtrans.attention.scaled_dot import CrossAttention, CrossState, SelfAttention, native_view
from seqtrans.linear import onednn
from seqtrans.linear.int8 import Int8Linear
from seqtrans.linear.onednn import OneDNNLinear
from seqtrans.model.layers import DecoderLayer
from seqtrans.model.norms import NativeLayerNorm, RMSNorm, native_lanes
from seqtrans.model.state import DecoderState
from seqtrans.runtime import environment
from seqtrans.runtime.timing import TimedChoice

#: Steps of each way timed before the faster is kept, per (rows, threads).
TRIALS = 3

# (the decoder's shape, rows, threads) -> the choice between the step and the layers
_choices: dict[tuple[tuple[int, ...], int, int], TimedChoice[bool]] = {}
_choices_lock = threading.Lock()


def _linear(layer: nn.Module) -> native.StepLinear | None:
    """``layer`` as the native step reads it, or None where the step cannot run it as the
    layer runs itself: an int8 layer with the native product's unsigned rows, or a float32
    layer whose one packed block the native kernel multiplies with oneDNN's bits."""
    bias = getattr(layer, "bias", None)
    if bias is not None and not (bias.dtype == torch.float32 and bias.is_contiguous()):
        return None
    bias_address = None if bias is None else bias.data_ptr()
    if isinstance(layer, OneDNNLinear) and native.decoder_step_available("float32"):
        block = layer.native_block()
        if block is None:
            return None
        return native.StepLinear(block[0], None, None, bias_address, block[1], 0, 1)
    if not (isinstance(layer, Int8Linear) and layer.unsigned and layer.qweight.is_contiguous()
            and layer.scale.is_contiguous() and layer.compensation.is_contiguous()
            and native.decoder_step_available("int8")):
        return None
    return native.StepLinear(layer.qweight.data_ptr(), layer.scale.data_ptr(), layer.compensation.data_ptr(),
                             bias_address, layer.out_features, int(layer.bias_after), 0)


def _norm(norm: nn.Module, kind: type[nn.Module], eps: float) -> tuple[int, int | None] | None:
    """The addresses of ``norm``'s weight and bias (None for RMSNorm's), where it is a norm of
    ``kind`` with ``eps`` that the native kernels normalise as it does itself; (0, None) for
    PyTorch's LayerNorm, which the step leaves to it (``NativeStep.segmented``); else None."""
    norms = (RMSNorm, NativeLayerNorm, nn.LayerNorm)
    if type(norm) is not kind or not isinstance(norm, norms) or norm.eps != eps:
        return None
    if type(norm) is nn.LayerNorm:
        return (0, None) if norm.weight is not None and norm.bias is not None else None
    if isinstance(norm, NativeLayerNorm):
        return (norm.weight.data_ptr(), norm.bias.data_ptr()) if norm.native() else None
    weight = norm.weight
    if weight.dtype != torch.float32 or not weight.is_contiguous():
        return None
    return weight.data_ptr(), None


class NativeStep:
    """The native step of one decoder (:func:`native_step` makes it): :meth:`run`."""

    def __init__(self, layers: list[DecoderLayer], final_norm: nn.Module, output_scale: float | None,
                 model: native.StepModel, table: Any, *, native_ffn: bool = True) -> None:
        self.layers = layers  # kept: the structures point into their tensors
        self.final_norm, self.output_scale = final_norm, output_scale  # what a copy is made again from
        self.model, self.table = model, table
        # a feed-forward layer no kernel here computes (GELU, SiLU, a gate): the layers' own
        self.python_ffn = not native_ffn
        # PyTorch's LayerNorm, whose bits no kernel gives, and the layers' own feed-forward:
        # the step calls them between native sub-layers
        self.segmented = type(layers[0].r1.norm) is nn.LayerNorm or self.python_ffn
        # float32 layers are multiplied natively up to the rows their own calls are (beyond,
        # by oneDNN): the step keeps to those, and so to the very same kernels
        packed = any(getattr(entry, name).packed for entry in self.table
                     for name in ("qkv", "self_out", "cross_q", "cross_out", "inner", "outer"))
        self.max_rows = onednn.NATIVE_ROWS if packed else None
        # what sets the two ways' times besides the rows: models of one shape share a choice
        self.shape = (self.model.layers, self.model.d_model, self.model.heads * self.model.head_dim,
                      self.table[0].inner.outputs, int(packed), int(self.segmented), int(self.python_ffn))

    def __deepcopy__(self, memo: dict[int, Any]) -> NativeStep | None:
        # a copy's own, pointing into the copied layers' tensors
        return native_step(copy.deepcopy(self.layers, memo), copy.deepcopy(self.final_norm, memo),
                           self.output_scale)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a native decoder step points into its model's tensors and is not saved")

    def _covers(self, x: Tensor, state: DecoderState, offset: int) -> bool:
        if (x.size(1) != 1 or x.dtype != torch.float32 or x.device.type != "cpu" or torch.is_grad_enabled()
                or len(state.caches) != len(self.layers) or state.extensions
                or (self.max_rows is not None and x.size(0) > self.max_rows)):
            return False
        for layer, cache, cross in zip(self.layers, state.caches, state.cross):
            if layer.training or not isinstance(cache, BeamKVCache) or cache.length != offset:
                return False
            if not (isinstance(cross, CrossState) and not cross.lag and cross.source is None
                    and cross.sizes is not None and cross.k.dtype == torch.float32
                    and cross.k.is_contiguous() and cross.v.is_contiguous()):
                return False
        return x.size(0) % cast(CrossState, state.cross[0]).k.size(0) == 0

    def run(self, x: Tensor, state: DecoderState, offset: int, bias: Tensor | None,
            layers: Callable[[], Tensor]) -> Tensor:
        """The decoder's last hidden states [N, 1, D] (after its final norm and output scale)
        for ``x`` [N, 1, D], the embedded new position ``offset`` of each hypothesis; ``bias``
        [1, H, 1, offset + 1] the self-attention's position bias, or None. Natively, or
        ``layers()`` (the layers' own path) where the step does not cover this one or was
        timed slower for this decoder's shape, N and the threads; either way the caches in
        ``state`` take the new position."""
        if not self._covers(x, state, offset):
            return layers()
        key = (self.shape, x.size(0), torch.get_num_threads())
        trial = _choices.get(key)
        if trial is None:
            with _choices_lock:
                trial = _choices.setdefault(key, TimedChoice((True, False), trials=TRIALS))
        if trial.chosen is not None:
            return self._native(x, state, offset, bias) if trial.chosen else layers()
        use = trial.next()
        start = time.perf_counter()
        out = self._native(x, state, offset, bias) if use else layers()
        with _choices_lock:
            trial.record(use, time.perf_counter() - start)
        return out

    def _native(self, x: Tensor, state: DecoderState, offset: int, bias: Tensor | None) -> Tensor:
        n, end = x.size(0), offset + 1
        beam = n // cast(CrossState, state.cross[0]).k.size(0)
        # this step's own copies of the tables, which it fills with its state's addresses:
        # threads may decode with one model at once (a server's workers)
        table = type(self.table).from_buffer_copy(self.table)
        model = native.StepModel.from_buffer_copy(self.model)
        for entry, cache, cross in zip(table, state.caches, state.cross):
            assert isinstance(cache, BeamKVCache) and isinstance(cross, CrossState)
            cache._reserve(end)  # the buffers may grow: their addresses are read after
            native_view(cross, n, beam)
            entry.cache_k, entry.cache_v = cache._k.data_ptr(), cache._v.data_ptr()
            entry.sources, entry.sources_stride = cache.sources.data_ptr(), cache.sources.stride(0)
            entry.capacity = cache._k.size(2)
            entry.cross_k, entry.cross_v = cross.k.data_ptr(), cross.v.data_ptr()
            assert cross.native_rows is not None and cross.native_sizes is not None
            entry.cross_rows = cross.native_rows.data_ptr()
            entry.cross_lengths = cross.native_sizes.data_ptr()
            entry.source_length = cross.k.size(2)
        model.group = beam
        # [H, L], as the layer takes it
        row_bias = None if bias is None else bias[0, :, -1].float().contiguous()
        hidden = x.reshape(n, x.size(2)).clone()  # [N, D], written in place
        if self.segmented:
            hidden = self._segmented(model, table, hidden, offset, row_bias)
        else:
            native.decoder_step(model, table, hidden, offset, row_bias)
        for cache in state.caches:
            cache.length = end
        return hidden.view(n, 1, -1)

    def _segmented(self, model: native.StepModel, table: Any, hidden: Tensor, offset: int,
                   bias: Tensor | None) -> Tensor:
        """The step with the layers' own LayerNorms (PyTorch's) between its native sub-layers,
        each residual sum in the sub-layer's call: the layers' arithmetic, a call a sub-layer;
        where no kernel computes the feed-forward layer, it and its residual as the layer
        computes them, on the [N, 1, D] it takes."""
        n = hidden.size(0)
        for index, layer in enumerate(self.layers):
            for which, residual in enumerate((layer.r1, layer.r2, layer.r3)):
                if which == 2 and self.python_ffn:
                    x = hidden.view(n, 1, -1)
                    hidden = residual(x, layer.ffn(residual.input(x))).reshape(n, -1)
                    continue
                source = residual.norm(hidden) if residual.pre_norm else hidden
                native.decoder_sublayer(model, table, index, which, source, hidden, offset, bias)
                if not residual.pre_norm:
                    hidden = residual.norm(hidden)
        hidden = self.final_norm(hidden)
        return hidden if self.output_scale is None else hidden * self.output_scale


def native_step(layers: list[DecoderLayer], final_norm: nn.Module,
                output_scale: float | None) -> NativeStep | None:
    """The native step of a decoding copy's ``layers`` and ``final_norm`` (a norm of the
    layers' kind for pre-norm layers, an identity for post-norm ones), or None where it does
    not cover them (see the module's notes), the kernels are not built here, or
    ``SEQTRANS_NATIVE_STEP=0``."""
    if not layers or not environment.native_step() or not native.available():
        return None
    first, norm = layers[0], layers[0].r1.norm
    pre, eps, kind = first.r1.pre_norm, getattr(norm, "eps", None), type(norm)
    d = norm.weight.numel() if isinstance(norm, (RMSNorm, NativeLayerNorm, nn.LayerNorm)) else 0
    # RMSNorm sums as PyTorch sums, in vectors of these lanes; LayerNorm needs none
    lanes = native_lanes(d) if kind is RMSNorm else 1
    if not d or not lanes or not isinstance(eps, float):
        return None
    final: tuple[int, int | None] | None = None
    if pre:
        final = _norm(final_norm, kind, eps)
        if final is None:
            return None
    elif not isinstance(final_norm, nn.Identity):
        return None
    table = (native.StepLayer * len(layers))()
    shapes = {_layer(entry, layer, pre=pre, kind=kind, eps=eps, d=d) for entry, layer in zip(table, layers)}
    if len(shapes) != 1 or None in shapes:
        return None
    heads, head_dim, self_scale, cross_scale, native_ffn = cast(tuple[int, int, float, float, bool],
                                                                shapes.pop())
    model = native.StepModel(
        layers=len(layers), d_model=d, heads=heads, head_dim=head_dim,
        pre_norm=int(pre), lanes=lanes, group=1, has_final_norm=int(pre),
        has_output_scale=int(output_scale is not None), eps=eps, self_scale=self_scale,
        cross_scale=cross_scale, output_scale=1.0 if output_scale is None else output_scale,
        final_norm=None if final is None else final[0], final_norm_bias=None if final is None else final[1])
    return NativeStep(layers, final_norm, output_scale, model, table, native_ffn=native_ffn)


def _layer(entry: native.StepLayer, layer: DecoderLayer, *, pre: bool, kind: type[nn.Module], eps: float,
           d: int) -> tuple[int, int, float, float, bool] | None:
    """Fills ``entry`` with ``layer``'s weights; its heads, their width, its self- and
    cross-attention scales and whether a kernel computes its feed-forward layer (a ReLU,
    no gate: else the step calls the layer's own), or None where the step does not cover
    the layer."""
    if (type(layer) is not DecoderLayer or type(layer.self_attn) is not SelfAttention
            or type(layer.cross_attn) is not CrossAttention):
        return None
    attn, cross, ffn = layer.self_attn, layer.cross_attn, layer.ffn
    native_ffn = ffn.gate is None and ffn.activation is F.relu
    if cross.heads != attn.heads or cross.head_dim * cross.heads != attn.out.in_features:
        return None
    residuals = (layer.r1, layer.r2, layer.r3)
    if any(r.pre_norm != pre for r in residuals):
        return None
    norms = [_norm(r.norm, kind, eps) for r in residuals]
    linears = [_linear(m) for m in (attn.qkv, attn.out, cross.q, cross.out,
                                    *((ffn.inner, ffn.outer) if native_ffn else ()))]
    if any(w is None for w in norms) or any(w is None for w in linears) or attn.qkv.in_features != d:
        return None
    entry.norm[:] = [cast(tuple[int, int | None], n)[0] for n in norms]
    entry.norm_bias[:] = [cast(tuple[int, int | None], n)[1] for n in norms]
    entry.qkv, entry.self_out, entry.cross_q, entry.cross_out = linears[:4]
    if native_ffn:
        entry.inner, entry.outer = linears[4:]
    dim = attn.out.in_features // attn.heads
    # the scales as the layers pass them to the kernel (None: 1/sqrt(d))
    return (attn.heads, dim, dim ** -0.5 if attn.scale is None else attn.scale,
            cross.head_dim ** -0.5 if cross.scale is None else cross.scale, native_ffn)
