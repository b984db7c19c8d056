"""int8 decoding (``decode.precision=int8``): linear layers with int8 weights and
activations quantized as they arrive.

Weights are quantized once, symmetrically per output channel: ``s_w[o] = max|W[o, :]| / 127``,
``W_q = round(W / s_w)``. Activations are quantized at every call, symmetrically per row:
``s_x[m] = max|x[m, :]| / 127``, ``x_q = round(x / s_x)``. Then
``y[m, o] = (x_q @ W_q.T)[m, o] * s_x[m] * s_w[o] + b[o]``, the integer product exact in
int32 (``torch._int_mm``: VNNI instructions on x86 CPUs that have them).

:func:`quantized` makes a decoding copy of a model; the model itself is left as it is.

Shapes: M rows, K inputs, O outputs.
"""

from __future__ import annotations

import copy
import itertools

import torch
from torch import Tensor, nn

from seqtrans.errors import ConfigError
from seqtrans.model import Transformer

#: Largest magnitude of a quantized value; symmetric, so -128 is never used.
QMAX = 127


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row (ties round to even).
    x [M, K] float -> (x_q [M, K] int8, scale [M, 1] float32) with x ~ x_q * scale"""
    # a row of zeros gets scale 1 rather than 0, so that x / scale stays 0
    scale = x.abs().amax(dim=-1, keepdim=True).float().div_(QMAX)  # [M, 1]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).to(torch.int8), scale


class Int8Linear(nn.Module):
    """``y = x @ W.T + b`` with W in int8 (per-output-channel scales) and x quantized per row.

    ``forward(x [..., K]) -> [..., O]`` in float32. ``weight`` and ``bias`` are the float
    tensors it was made from, shared (not copied), for code that reads a layer's weight.
    """

    qweight: Tensor
    scale: Tensor

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        q, s = quantize_rows(weight.detach())
        self.register_buffer("qweight", q)  # [O, K]
        self.register_buffer("scale", s.view(-1))  # [O]
        self.weight = weight
        self.bias = bias

    @property
    def in_features(self) -> int:
        return self.qweight.size(1)

    @property
    def out_features(self) -> int:
        return self.qweight.size(0)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.size(-1))  # [M, K]
        xq, xs = quantize_rows(x2)
        # [K, O] as a transposed view: the layout _int_mm was fastest with for one row
        acc = torch._int_mm(xq, self.qweight.t())  # [M, O] int32, exact
        out = acc.to(torch.float32).mul_(xs).mul_(self.scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*lead, self.out_features)


def quantized(model: Transformer) -> Transformer:
    """A copy of ``model`` for int8 decoding on CPU: every ``nn.Linear`` becomes an
    :class:`Int8Linear`, and the output projection too (with tied embeddings it quantizes
    a copy of the embedding matrix; the embedding lookup stays float32). The copy shares
    the model's float tensors and never writes them; the model is unchanged."""
    device = model.output_weight.device
    if device.type != "cpu":
        raise ConfigError("decode.precision", f"int8 decodes on CPU only, not on {device.type}; "
                          "use fp32 or bf16 there")
    # deepcopy with every parameter and buffer in the memo copies the modules, not the tensors
    memo: dict[int, object] = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    twin = copy.deepcopy(model, memo)
    made: dict[int, Int8Linear] = {}  # a layer shared by several modules is quantized once
    for parent in list(twin.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                if id(child) not in made:
                    made[id(child)] = Int8Linear(child.weight, child.bias)
                setattr(parent, name, made[id(child)])
    twin.projection = Int8Linear(model.output_weight)
    return twin.eval()
