"""The layers of the Transformer (Vaswani et al. 2017, section 3): position encodings,
the position-wise feed-forward network, the residual connection around each sub-layer,
and one encoder and one decoder layer; and the builders of the embedding and relative
position tables. :mod:`seqtrans.model.transformer` stacks them into the model.

Shapes: B sentences, N rows (hypotheses), S source length, T target length (this call),
D d_model, H heads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention import DecodingState, KVCache, Recorder, cross_attention, self_attention
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import PAD
from seqtrans.model.dropout import Dropout
from seqtrans.model.norms import make_norm
from seqtrans.model.relative import RelativePositionBias


class Positions(nn.Module):
    """Sinusoidal (paper, section 3.5) or learned (Table 3, row E) position encodings.

    Sinusoids interleave sin and cos per frequency as the paper's formula does, or
    (``layout="split"``) put every sine first and every cosine after them; their
    frequencies are the paper's, or fairseq's (``frequencies="fairseq"``). Position p
    of a sequence is encoded as ``offset + p`` (``model.position_offset``), and a learned
    table holds that many rows more."""

    inv_freq: Tensor

    def __init__(self, kind: str, d_model: int, max_positions: int, *, layout: str = "interleaved",
                 frequencies: str = "paper", offset: int = 0) -> None:
        super().__init__()
        self.kind = kind
        self.layout = layout
        self.max_positions = max_positions
        self.offset = offset
        if kind == "learned":
            self.table = nn.Embedding(max_positions + offset, d_model)
            nn.init.normal_(self.table.weight, std=d_model**-0.5)
        elif frequencies == "fairseq":
            # 1 / 10000^(i / (D/2 - 1)) for i < D/2
            half = d_model // 2
            inv_freq = torch.exp(torch.arange(half) * -(math.log(10000.0) / (half - 1)))
            self.register_buffer("inv_freq", inv_freq, persistent=False)
        else:
            # PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...)
            inv_freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            self.register_buffer("inv_freq", inv_freq, persistent=False)
        # single positions' encodings as forward computed them: (start, device, the buffer) -> [1, D]
        self._rows: dict[tuple[int, torch.device, int, torch.dtype], Tensor] = {}

    def forward(self, length: int, *, offset: int = 0, device: torch.device) -> Tensor:
        """The encodings of positions offset .. offset+length-1.  -> [T, D]"""
        if self.kind == "learned":
            if offset + length > self.max_positions:
                raise ValueError(
                    f"position {offset + length - 1} is beyond model.max_positions="
                    f"{self.max_positions} of the learned position embeddings"
                )
            start = self.offset + offset
            return self.table(torch.arange(start, start + length, device=device))
        start = self.offset + offset
        if length != 1:
            return self._sinusoids(start, length, device)
        # a decoding step's one position, made once: the same computation's bits, without its
        # five operators at every step of every search
        key = (start, device, self.inv_freq.data_ptr(), self.inv_freq.dtype)
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= 4 * self.max_positions:
                self._rows.clear()  # (moved or cast buffers leave old keys behind)
            row = self._rows[key] = self._sinusoids(start, 1, device)
        return row

    def _sinusoids(self, start: int, length: int, device: torch.device) -> Tensor:
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        angles = pos[:, None] * self.inv_freq[None, :]  # [T, D/2]
        if self.layout == "split":
            return torch.cat([angles.sin(), angles.cos()], dim=-1)  # [T, D] sines, then cosines
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # [T, D] interleaved


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": _gelu_tanh, "silu": F.silu,
}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3); GELU or SiLU in place of the max
    with ``activation``. ``gated``: FFN(x) = (act(x W1) * (x V)) W2 (Shazeer 2020), V
    being ``gate``; ``bias``: False leaves out b1, b2 (and V's)."""

    def __init__(self, d_model: int, d_ff: int, *, dropout: float, activation: str = "relu",
                 gated: bool = False, bias: bool = True) -> None:
        super().__init__()
        self.activation = _ACTIVATIONS[activation]
        self.inner = nn.Linear(d_model, d_ff, bias=bias)
        self.outer = nn.Linear(d_ff, d_model, bias=bias)
        # made after the others, so that a model without it initialises as before
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.dropout = Dropout(dropout)
        for lin in (self.inner, self.outer, self.gate):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            return self.outer(self.dropout(self.activation(self.inner(x)) * self.gate(x)))
        if self.activation is F.relu and not torch.is_grad_enabled():
            # decoding: the activation over the inner product's own fresh output, in the
            # product's last pass where the layer offers it (an int8 layer's scales)
            if getattr(self.inner, "fuses_relu", False):
                return self.outer(self.dropout(self.inner(x, relu=True)))
            return self.outer(self.dropout(self.inner(x).relu_()))
        return self.outer(self.dropout(self.activation(self.inner(x))))


class Residual(nn.Module):
    """Dropout, residual connection and LayerNorm around one sub-layer: post-norm
    ``LN(x + drop(f(x)))`` as in the paper, or pre-norm ``x + drop(f(LN(x)))``; RMSNorm
    in place of LayerNorm with ``norm="rms"``."""

    def __init__(self, d_model: int, *, dropout: float, pre_norm: bool, norm: str = "layer",
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = make_norm(norm, d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer_out)
        return self.norm(x + self.dropout(sublayer_out))

    def input(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: LN(x) for pre-norm, x itself for post-norm."""
        return self.norm(x) if self.pre_norm else x


def _feed_forward(c: ModelConfig) -> FeedForward:
    return FeedForward(c.d_model, c.d_ff, dropout=c.activation_dropout, activation=c.activation,
                       gated=c.gated_ffn, bias=c.bias)


def _residual(c: ModelConfig) -> Residual:
    return Residual(c.d_model, dropout=c.dropout, pre_norm=c.norm == "pre", norm=c.norm_kind, eps=c.norm_eps)


class EncoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(c.encoder_attention, c)
        self.causal = c.causal_encoder
        self.ffn = _feed_forward(c)
        self.r1 = _residual(c)
        self.r2 = _residual(c)

    def forward(self, x: Tensor, mask: Tensor | None, *, cache: KVCache | None = None,
                record: Recorder | None = None, position_bias: Tensor | None = None) -> Tensor:
        """x [B, S, D], mask [B, S] -> [B, S, D]; a causal encoder may extend a cache;
        ``position_bias`` [1, H, S, S'] is added to the self-attention logits."""
        h = self.r1.input(x)
        if record is not None:
            record.encoder_self(self.self_attn, h, mask=mask, causal=self.causal, position_bias=position_bias)
        x = self.r1(x, self.self_attn(h, mask=mask, causal=self.causal, cache=cache,
                                      position_bias=position_bias))
        return self.r2(x, self.ffn(self.r2.input(x)))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.self_attn = self_attention(c.decoder_attention, c)
        self.cross_attn = cross_attention(c.cross_attention, c)
        self.ffn = _feed_forward(c)
        self.r1 = _residual(c)
        self.r2 = _residual(c)
        self.r3 = _residual(c)

    def forward(self, x: Tensor, cross: DecodingState, *, cache: KVCache | None = None,
                record: Recorder | None = None, position_bias: Tensor | None = None) -> Tensor:
        """x [N, T, D] -> [N, T, D]; ``position_bias`` [1, H, T, L] is added to the
        self-attention logits."""
        h = self.r1.input(x)
        if record is not None:
            record.decoder_self(self.self_attn, h, position_bias=position_bias)
        x = self.r1(x, self.self_attn(h, causal=True, cache=cache, position_bias=position_bias))
        h = self.r2.input(x)
        if record is not None:
            record.encoder_decoder(self.cross_attn, h)
        x = self.r2(x, self.cross_attn(h, cross))
        return self.r3(x, self.ffn(self.r3.input(x)))


def token_embeddings(vocab_size: int, d_model: int) -> nn.Embedding:
    """A token embedding table, N(0, d_model^-0.5), its padding row zero."""
    table = nn.Embedding(vocab_size, d_model, padding_idx=PAD)
    nn.init.normal_(table.weight, std=d_model**-0.5)
    nn.init.zeros_(table.weight[PAD])
    return table


def relative_bias(c: ModelConfig, *, bidirectional: bool) -> RelativePositionBias | None:
    """A stack's relative position bias table (model.positions=relative), else None."""
    if c.positions != "relative":
        return None
    return RelativePositionBias(c.heads, buckets=c.relative_buckets, max_distance=c.relative_max_distance,
                                bidirectional=bidirectional, d_model=c.d_model)
