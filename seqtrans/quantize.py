"""int8 decoding (``decode.precision=int8``): linear layers with int8 weights and
activations quantized as they arrive.

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

:func:`quantized` makes a decoding copy of a model; the model itself is left as it is.
:func:`onednn` makes the float32 decoding copy the same way, with linear layers that
multiply through oneDNN instead of the BLAS behind ``F.linear``.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import copy
import itertools
import weakref
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqtrans.errors import ConfigError
from seqtrans.model import Transformer

#: Largest magnitude of a quantized value; symmetric, so -128 is never used.
QMAX = 127


def quantize_rows(x: Tensor, *, unsigned: bool = False) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row (ties round to even).
    x [M, K] float -> (x_q [M, K] int8, scale [M, 1] float32) with x ~ x_q * scale;
    ``unsigned``: x_q + 128 as uint8."""
    # a row of zeros gets scale 1 rather than 0, so that x / scale stays 0
    scale = x.abs().amax(dim=-1, keepdim=True).float().div_(QMAX)  # [M, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(x / scale)
    return (q.add_(128).to(torch.uint8) if unsigned else q.to(torch.int8)), scale


def unsigned_activations() -> bool:
    """Whether this processor multiplies int8 faster with unsigned activations:
    AVX-512 VNNI without AMX (whose tiles multiply signed bytes directly)."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", lambda: False)()
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return bool(vnni and not amx)


class Int8Linear(nn.Module):
    """``y = x @ W.T + b`` with W in int8 (per-output-channel scales) and x quantized per row.

    ``forward(x [..., K]) -> [..., O]`` in float32. ``weight`` and ``bias`` are the float
    tensors it was made from, shared (not copied), for code that reads a layer's weight;
    no gradient flows through the layer.
    ``unsigned``: feed activations as uint8 (default: :func:`unsigned_activations`).
    """

    qweight: Tensor
    scale: Tensor
    compensation: Tensor

    def __init__(self, weight: Tensor, bias: Tensor | None = None, *, unsigned: bool | None = None) -> None:
        super().__init__()
        q, s = quantize_rows(weight.detach())
        self.register_buffer("qweight", q)  # [O, K]
        self.register_buffer("scale", s.view(-1))  # [O]
        # (x_q + 128) @ W_q.T = x_q @ W_q.T + 128 * (row sums of W_q)
        self.register_buffer("compensation", q.sum(dim=1, dtype=torch.int32).mul_(128))  # [O]
        self.unsigned = unsigned_activations() if unsigned is None else unsigned
        self.weight = weight
        self.bias = bias.detach() if bias is not None else None  # the same storage

    @property
    def in_features(self) -> int:
        return self.qweight.size(1)

    @property
    def out_features(self) -> int:
        return self.qweight.size(0)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))  # [M, K]
        xq, xs = quantize_rows(x2, unsigned=self.unsigned)
        # [K, O] as a transposed view: the layout _int_mm was fastest with for one row
        acc = torch._int_mm(xq, self.qweight.t())  # [M, O] int32, exact
        if self.unsigned:
            acc.sub_(self.compensation)
        out = acc.to(torch.float32).mul_(xs)
        if self.bias is None:
            return out.mul_(self.scale).view(*lead, self.out_features)
        return torch.addcmul(self.bias, out, self.scale, out=out).view(*lead, self.out_features)


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
