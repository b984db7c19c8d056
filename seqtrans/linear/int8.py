"""int8 linear layers (``decode.precision=int8``): int8 weights, and activations
quantized as they arrive.

Weights are quantized once, symmetrically per output channel: ``s_w[o] = max|W[o, :]| / 127``,
``W_q = round(W / s_w)``. Activations are quantized at every call, symmetrically per row:
``s_x[m] = max|x[m, :]| / 127``, ``x_q = round(x / s_x)``. Then
``y[m, o] = (x_q @ W_q.T)[m, o] * s_x[m] * s_w[o] + b[o]``, the integer product exact in
int32 (``torch._int_mm``: VNNI instructions on x86 CPUs that have them). Where the
processor has AVX-512 VNNI but no AMX, the activations go in as unsigned bytes
``x_q + 128`` (VNNI multiplies unsigned by signed bytes) and ``128 * sum_k W_q[o, k]`` is
subtracted: the same integers either way, so the choice never changes a result.
The CPU kernel takes any sizes (on CUDA it wants multiples of 8, and int8 decoding is
CPU-only), so nothing is padded.

For the few rows of a decoding step (up to :data:`NATIVE_ROWS`) with unsigned activations,
a layer also has :func:`seqtrans.native.int8_linear`: the same passes in one native call,
with a product (:func:`seqtrans.native.int8_product`) that reads each block of weight
rows once for all the rows. Which of the two is faster depends on the
processor, the rows, the threads and OpenMP's wait policy: over a decoding step's
weights on a 2-core AMD EPYC the native one was 1.2 to 2.7 times as fast at 1 to 16
rows (benchmarks/README.md, "Small steps"), but that is one machine, and a product timed apart from the
step's other weights sees other caches. So the first :data:`CHOICE_TRIALS` products of
each shape, as decoding makes them, are done each way in turn and timed, and the one with the lower
median is kept for the process (:func:`product_choices`). Both give the same integers,
so the choice never changes a result. That holds where PyTorch's product is native (VNNI
or AMX); on a processor with AVX2 alone it is a plain loop, and the native layer (its AVX2
product) serves every row count untimed (:func:`torch_product_is_native`).

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqtrans import native
from seqtrans.runtime import buffers
from seqtrans.runtime.system import release_mapped, trim_freed_memory
from seqtrans.runtime.timing import TimedChoice

#: Largest magnitude of a quantized value; symmetric, so -128 is never used.
QMAX = 127
#: Most rows for which a layer considers the native layer (:func:`seqtrans.native.int8_linear`).
NATIVE_ROWS = 16
#: Calls of each way (native, PyTorch's product) timed, in turn, before a shape's choice is made.
CHOICE_TRIALS = 5


# (rows, inputs, outputs, threads) -> its trial
_trials: dict[tuple[int, int, int, int], TimedChoice[bool]] = {}  # True: native
_trials_lock = threading.Lock()


def _torch_product(xq: Tensor, w: Tensor) -> Tensor:
    # [K, O] as a transposed view: the layout _int_mm was fastest with for one row; a large
    # vocabulary's products in memory kept from the last step (dequantize writes over them)
    return torch._int_mm(xq, w.t(), out=buffers.output(xq.size(0), w.size(0), dtype=torch.int32))


def _chosen(key: tuple[int, int, int, int], native_call: Callable[[], Tensor],
            torch_call: Callable[[], Tensor]) -> Tensor:
    """The result of whichever of the two calls was measured faster for ``key`` (rows,
    inputs, outputs, threads) in this process, timing them in turn until then (see the
    module's notes)."""
    trial = _trials.get(key)
    if trial is None:
        with _trials_lock:
            trial = _trials.setdefault(key, TimedChoice((True, False), trials=CHOICE_TRIALS))
    if trial.chosen is not None:
        return native_call() if trial.chosen else torch_call()
    # timed where it is used, as the model's other weights pass through the caches
    use = trial.next()
    start = time.perf_counter()
    out = native_call() if use else torch_call()
    with _trials_lock:
        trial.record(use, time.perf_counter() - start)
    return out


def product_choices() -> dict[tuple[int, int, int, int], str]:
    """The choices :class:`Int8Linear` layers have made in this process: (rows, inputs,
    outputs, threads) -> ``"native"`` or ``"torch"`` (shapes still being timed are left
    out)."""
    return {key: "native" if t.chosen else "torch" for key, t in sorted(_trials.items())
            if t.chosen is not None}


def quantize_rows(x: Tensor, *, unsigned: bool = False) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row (ties round to even).
    x [M, K] float -> (x_q [M, K] int8, scale [M, 1] float32) with x ~ x_q * scale;
    ``unsigned``: x_q + 128 as uint8."""
    # a row of zeros gets scale 1 rather than 0, so that x / scale stays 0
    scale = x.abs().amax(dim=-1, keepdim=True).float().div_(QMAX)  # [M, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(x / scale)
    return (q.add_(128).to(torch.uint8) if unsigned else q.to(torch.int8)), scale


def quantize_weight(w: Tensor, *, block: int = 4096, release: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`quantize_rows` of a weight matrix, the same bits, ``block`` rows at a time, so
    that its float temporaries stay small beside a large matrix (an embedding table), and
    for a float32 weight in one float buffer reused from block to block: new temporaries
    at every block left the C library's heap in pieces it did not reuse, and loading
    NLLB-200's shape in int8 peaked at a third more than it needed (docs/pretrained-families.md).
    ``release``: the float weight is let go after, so each block's pages are given back once
    read where they are a map of the checkpoint's file
    (:func:`~seqtrans.runtime.system.release_mapped`): the float matrix is never resident
    whole.  w [O, K] -> (W_q [O, K] int8, s_w [O, 1] float32)"""
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    s = torch.empty(w.size(0), 1, dtype=torch.float32, device=w.device)
    wide = (torch.empty(min(block, w.size(0)), w.size(1), dtype=torch.float32, device=w.device)
            if w.dtype == torch.float32 else None)
    for start in range(0, w.size(0), block):
        rows = w[start:start + block]  # [block, K]
        if wide is None:
            q[start:start + block], s[start:start + block] = quantize_rows(rows)
        else:
            _quantize_float32_rows(rows, wide[:rows.size(0)], q[start:start + block], s[start:start + block])
        if release:
            release_mapped(rows)
    if release:
        # a model converted in place, weight after weight: the heap's freed pieces, which glibc
        # kept from one weight to the next and which took loading NLLB-600M's shape in int8 to
        # 1.7 GiB instead of 1.1 (benchmarks/README.md, "The heap while an int8 copy is made")
        trim_freed_memory()
    return q, s


def _quantize_float32_rows(x: Tensor, work: Tensor, q: Tensor, scale: Tensor) -> None:
    """:func:`quantize_rows` of float32 rows x [M, K] written into q [M, K] int8 and scale
    [M, 1], through ``work`` [M, K] float32 instead of new temporaries: the same operators
    in the same order, so the same bits."""
    torch.abs(x, out=work)
    torch.amax(work, dim=-1, keepdim=True, out=scale)
    scale.div_(QMAX)
    scale.masked_fill_(~(scale > 0), 1.0)  # a row of zeros: scale 1, so that x / scale stays 0
    torch.div(x, scale, out=work)
    torch.round(work, out=work)
    q.copy_(work)


def row_sums(q: Tensor, *, block: int = 4096) -> Tensor:
    """Each row's sum of an int8 matrix, in int32: widened ``block`` rows at a time into one
    int32 buffer, reused. A sum with ``dtype=torch.int32`` widens its input into a new
    tensor, 4x the int8 rows; block by block those copies left the C library's heap in pieces
    it did not reuse, and the process grew by 4 bytes a weight (a GiB for NLLB-200's tied
    table) while an int8 copy was made.  q [O, K] int8 -> [O] int32"""
    sums = torch.empty(q.size(0), dtype=torch.int32, device=q.device)
    wide = torch.empty(min(block, q.size(0)), q.size(1), dtype=torch.int32, device=q.device)
    for start in range(0, q.size(0), block):
        rows = q[start:start + block]  # [block, K]
        part = wide[:rows.size(0)]
        part.copy_(rows)
        torch.sum(part, dim=1, out=sums[start:start + rows.size(0)])
    return sums


def _vnni_amx() -> tuple[bool, bool]:
    vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return bool(vnni), bool(amx)


def torch_product_is_native() -> bool:
    """Whether PyTorch's int8 product (``torch._int_mm``) runs a native kernel on this
    processor (VNNI or AMX). Elsewhere it is a plain loop, ten and more times slower
    than a float32 product, and the native kernels' AVX2 product serves every row count."""
    return any(_vnni_amx())


def unsigned_activations() -> bool:
    """Whether this processor multiplies int8 faster with unsigned activations:
    AVX-512 VNNI without AMX (whose tiles multiply signed bytes directly), or neither,
    where the native kernels' product (AVX2) takes unsigned bytes."""
    vnni, amx = _vnni_amx()
    return (vnni and not amx) or (not vnni and not amx and native.int8_product_available())


class Int8Linear(nn.Module):
    """``y = x @ W.T + b`` with W in int8 (per-output-channel scales) and x quantized per row.

    ``forward(x [..., K]) -> [..., O]`` in float32. ``weight`` and ``bias`` are the float
    tensors it was made from, shared (not copied), for code that reads a layer's weight;
    no gradient flows through the layer.
    ``unsigned``: feed activations as uint8 (default: :func:`unsigned_activations`).
    ``keep_float=False``: keep no reference to the float weight (``weight`` is None), so
    that it can be freed. ``rows``: the weight already quantized by
    :func:`quantize_rows`, ``(W_q [O, K], s_w [O, 1])``, shared (an int8 embedding table
    that is also the output projection). ``bias_after``: the bias added to the scaled
    product in a rounding of its own, the bits of adding it to the layer's output afterwards
    (:meth:`plus_bias`), not in one fused multiply-add with the scale.
    """

    qweight: Tensor
    scale: Tensor
    compensation: Tensor
    #: ``forward(x, relu=True)`` applies max(0, .) itself (seqtrans.model.layers.FeedForward)
    fuses_relu = True

    def __init__(self, weight: Tensor | None, bias: Tensor | None = None, *, unsigned: bool | None = None,
                 keep_float: bool = True, rows: tuple[Tensor, Tensor] | None = None,
                 bias_after: bool = False) -> None:
        super().__init__()
        if rows is None:
            if weight is None:
                raise ValueError("Int8Linear needs a float weight or its quantized rows")
            rows = quantize_weight(weight.detach(), release=not keep_float)
        q, s = rows
        self.register_buffer("qweight", q)  # [O, K]
        self.register_buffer("scale", s.view(-1))  # [O]
        # (x_q + 128) @ W_q.T = x_q @ W_q.T + 128 * (row sums of W_q)
        self.register_buffer("compensation", row_sums(q).mul_(128))  # [O]
        self.unsigned = unsigned_activations() if unsigned is None else unsigned
        self.weight = weight if keep_float else None
        self.bias = bias.detach() if bias is not None else None  # the same storage
        self.bias_after = bias_after

    @property
    def in_features(self) -> int:
        return self.qweight.size(1)

    @property
    def out_features(self) -> int:
        return self.qweight.size(0)

    def rows(self, ids: Tensor) -> Int8Linear:
        """The layer of the output rows ``ids`` [O'] only (their int8 weights copied, the
        same bits), for a product restricted to them (a vocabulary shortlist)."""
        bias = None if self.bias is None else self.bias[ids]
        return Int8Linear(None, bias, unsigned=self.unsigned, keep_float=False,
                          rows=(self.qweight[ids], self.scale[ids].unsqueeze(1)), bias_after=self.bias_after)

    def plus_bias(self, bias: Tensor) -> Int8Linear:
        """This layer's product with ``bias`` [O] added in the same pass as the scales, its int8
        weights shared: the same bits as adding ``bias`` to its output afterwards
        (``bias_after``), without a pass over the output of its own, which for a large
        vocabulary's logits costs as much as a step's other layers."""
        if self.bias is not None:
            raise ValueError("plus_bias: the layer already adds a bias")
        return Int8Linear(self.weight, bias, unsigned=self.unsigned, keep_float=self.weight is not None,
                          rows=(self.qweight, self.scale.unsqueeze(1)), bias_after=True)

    def forward(self, x: Tensor, *, relu: bool = False) -> Tensor:
        """``relu``: max(0, y), in the same pass as the scales where the native kernels are
        (a feed-forward layer's inner product)."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))  # [M, K]
        # the float passes in one native pass each where they can be (the same bits)
        fused = (x2.dtype == torch.float32 and x2.device.type == "cpu" and x2.stride(-1) == 1
                 and native.available())
        native_layer = fused and self.unsigned and native.built_with_int8_product()
        if native_layer and not torch_product_is_native():
            out = self._native(x2, relu=relu)
        elif native_layer and x2.size(0) <= NATIVE_ROWS:
            key = (x2.size(0), x2.size(1), self.qweight.size(0), torch.get_num_threads())
            out = _chosen(key, lambda: self._native(x2, relu=relu),
                          lambda: self._passes(x2, relu=relu, fused=True))
        else:
            out = self._passes(x2, relu=relu, fused=fused)
        return out.view(*lead, out.size(1))

    def _native(self, x2: Tensor, *, relu: bool) -> Tensor:
        return native.int8_linear_unchecked(x2, self.qweight, self.scale, compensation=self.compensation,
                                            bias=self.bias, relu=relu, bias_after=self.bias_after)

    def _passes(self, x2: Tensor, *, relu: bool, fused: bool) -> Tensor:
        """The layer as quantize, PyTorch's product and dequantize: x2 [M, K] -> [M, O];
        ``fused``: the float passes natively."""
        quantize = native.quantize_rows if fused else quantize_rows
        xq, xs = quantize(x2, unsigned=self.unsigned)
        acc = _torch_product(xq, self.qweight)  # [M, O] int32, exact
        if fused:
            compensation = self.compensation if self.unsigned else None
            return native.dequantize(acc, xs, self.scale, compensation=compensation, bias=self.bias,
                                     relu=relu, bias_after=self.bias_after)
        if self.unsigned:
            acc.sub_(self.compensation)
        out = acc.to(torch.float32).mul_(xs)
        if self.bias is None or self.bias_after:
            out.mul_(self.scale)
            if self.bias is not None:
                out.add_(self.bias)
        else:
            torch.addcmul(self.bias, out, self.scale, out=out)
        return out.relu_() if relu else out


class Int8Embedding(nn.Module):
    """An embedding table in int8, quantized as :class:`Int8Linear` quantizes a weight
    (symmetrically per row, ``E ~ E_q * s``), looked up and dequantized row by row.
    Made from a float table, which it keeps no reference to (``release``: its pages are
    given back as :func:`quantize_weight` reads them); a tied output projection
    shares its rows (``Int8Linear(None, rows=(table.qweight, table.scale[:, None]))``).

    ``forward(ids [...]) -> [..., D]`` in float32.
    """

    qweight: Tensor
    scale: Tensor

    def __init__(self, weight: Tensor, *, release: bool = False) -> None:
        super().__init__()
        q, s = quantize_weight(weight.detach(), release=release)
        self.register_buffer("qweight", q)  # [V, D]
        self.register_buffer("scale", s.view(-1))  # [V]

    @property
    def num_embeddings(self) -> int:
        return self.qweight.size(0)

    @property
    def embedding_dim(self) -> int:
        return self.qweight.size(1)

    def forward(self, ids: Tensor) -> Tensor:
        rows = torch.nn.functional.embedding(ids, self.qweight).to(torch.float32)  # [..., D]
        return rows.mul_(self.scale[ids].unsqueeze(-1))
