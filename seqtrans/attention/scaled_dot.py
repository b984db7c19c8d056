"""Multi-head scaled dot-product attention (paper, section 3.2), through
``torch.nn.functional.scaled_dot_product_attention`` so fused kernels are used where
the hardware has them.

Encoder-decoder attention also decodes wait-k (Ma et al. 2019, STACL): with a lag k,
target position i attends to the first i + k source positions only (every position,
the end symbol included, once i + k exceeds the source's words). A model trained with
that prefix-to-prefix mask (``model.wait_k``), or with k drawn anew for every batch
(``model.multi_k``, Elbayad et al. 2020), translates while its source arrives: with a
causal encoder, ``follow`` reads the source only as far as the next step's k needs.
:func:`waiting` sets the lag of a decoding (``decode.wait_k``) or of a training batch
without touching the modules, so that decoding copies of a model (int8, oneDNN), an
ensemble's members and concurrent decodings each see the lag their caller chose.

When decoding on the CPU (no gradient, eval mode), a sentence's attention runs over its
own positions only and through the same kernels whatever else is in the batch, so that
it decodes to the same bits alone as in any batch (docs/concepts.md): the encoder's
self-attention one sentence at a time over its real tokens, and for one new query per
hypothesis (float32, with the native kernels) self-attention over the cache and
encoder-decoder attention over each source's own length in
:func:`seqtrans.native.beam_attention`, whose sums run in an order no other row changes.

Variants of the paper's attention that models trained elsewhere use (Raffel et al.
2020), each a model option: heads of another width than D/H (``model.head_dim``),
projections without biases (``model.bias``), logits not divided by sqrt(d)
(``model.attention_scale``), and self-attention logits plus a bias that the caller
computes from the positions (``position_bias``, ``model.positions=relative``). One new
query per hypothesis over the cache gets it through the native kernel, which adds the
same bias to every hypothesis's logits; every other call goes through SDPA with a float
mask.

Shapes: B sentences, K hypotheses per sentence (beam), N = B*K rows, S source,
T target (new tokens this call), L cached target positions, H heads, D model, d the
width of a head (D/H unless ``model.head_dim`` says).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqtrans.attention.cache import BeamKVCache, KVCache, new_cache
from seqtrans.attention.common import each_sentence, masked_softmax, prefix_lengths, self_attention_mask
from seqtrans.model.masks import additive_mask, causal_mask, key_mask

if TYPE_CHECKING:
    from seqtrans.attention.monotonic import SourceStream

# The wait-k lag that encoder-decoder attention prepared now uses; None: the module's own.
_LAG: ContextVar[int | None] = ContextVar("seqtrans_wait_k", default=None)


@contextmanager
def waiting(lag: int | None) -> Iterator[None]:
    """Encoder-decoder attention prepared inside this block decodes wait-``lag``
    (0: the whole source). None changes nothing: the lag of an enclosing block, else
    each module's own (``model.wait_k``)."""
    if lag is None:
        yield
        return
    token = _LAG.set(lag)
    try:
        yield
    finally:
        _LAG.reset(token)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """[N, T, H*d] -> [N, H, T, d]"""
    n, t, width = x.shape
    return x.view(n, t, heads, width // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[N, H, T, d] -> [N, T, H*d]"""
    n, h, t, d = x.shape
    return x.transpose(1, 2).reshape(n, t, h * d)


def _projections(*pairs: tuple[int, int], bias: bool) -> list[nn.Linear]:
    """Linear layers [in -> out] for each (in, out) pair, with or without biases."""
    return [nn.Linear(i, o, bias=bias) for i, o in pairs]


def _zero_biases(*layers: nn.Linear) -> None:
    for layer in layers:
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused query/key/value projection.

    ``forward(x [N, T, D], mask=[N, T] | None, causal=bool, cache=KVCache | None,
    position_bias=[1, H, T, L] | None) -> [N, T, D]``

    ``head_dim`` (default D/H), ``bias`` and ``scaled`` (logits divided by sqrt(d)) are
    the model's options; ``relative``: the caller adds a ``position_bias`` to the logits
    at every call (one new query per hypothesis over a :class:`BeamKVCache` gets it through
    the native kernel, which adds it to each hypothesis's logits).
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0, head_dim: int | None = None,
                 bias: bool = True, scaled: bool = True, relative: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.scale = None if scaled else 1.0  # None: SDPA's and the kernel's 1/sqrt(d)
        self.relative = relative
        inner = heads * (head_dim or d_model // heads)
        self.qkv, self.out = _projections((d_model, 3 * inner), (inner, d_model), bias=bias)
        nn.init.xavier_uniform_(self.qkv.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out.weight)
        _zero_biases(self.qkv, self.out)

    def new_cache(self, rows: int, capacity: int, *, like: Tensor) -> KVCache:
        """A cache for ``rows`` hypotheses (:func:`seqtrans.attention.cache.new_cache`)."""
        return new_cache(rows, self.heads, self.out.in_features // self.heads, capacity, like=like)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None, position_bias: Tensor | None = None) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x [N, T, H*d]
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))  # [N, H, T, d]
        one_query = q.size(2) == 1 and q.dtype == torch.float32 and mask is None
        if isinstance(cache, BeamKVCache) and one_query:
            cache.store(k, v)
            # the one query's bias over every position [H, L]: the same for each hypothesis
            bias = None if position_bias is None else position_bias[0, :, -1].float()
            return self.out(merge_heads(cache.attend(q, scale=self.scale, bias=bias)))
        if position_bias is not None:
            return self.out(merge_heads(self._biased(q, k, v, position_bias, mask=mask, causal=causal,
                                                     cache=cache)))
        if mask is not None and cache is None and self._decoding_on_cpu(x):  # the same bits in any batch
            lengths = prefix_lengths(mask)
            if lengths is not None:
                return self.out(merge_heads(each_sentence(q, k, v, lengths, causal=causal, scale=self.scale)))
        attn_mask = key_mask(mask) if mask is not None else None  # [N, 1, 1, T]
        is_causal = causal
        if cache is not None:
            k, v = cache.append(k, v)  # [N, H, L+T, d]
            if causal and q.size(2) > 1:
                attn_mask = causal_mask(q.size(2), k.size(2), device=x.device)  # [T, L+T]
            is_causal = False  # a single new query may see every cached key
            if mask is not None:
                raise ValueError("a key padding mask cannot be combined with a cache")
        elif causal and attn_mask is not None:
            attn_mask = attn_mask & causal_mask(q.size(2), k.size(2), device=x.device)
            is_causal = False
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
        )  # [N, H, T, d]
        return self.out(merge_heads(out))

    def _decoding_on_cpu(self, x: Tensor) -> bool:
        return x.device.type == "cpu" and not self.training and not torch.is_grad_enabled()

    def _biased(self, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, *, mask: Tensor | None, causal: bool,
                cache: KVCache | None) -> Tensor:
        """Attention whose logits get ``bias`` [1, H, T, L] added, through SDPA with a float
        mask (bias where allowed, -inf elsewhere).  q, k, v [N, H, T, d] -> [N, H, T, d]"""
        bias = bias.to(q.dtype)
        if cache is not None:
            if mask is not None:
                raise ValueError("a key padding mask cannot be combined with a cache")
            k, v = cache.append(k, v)  # [N, H, L, d]
        elif mask is not None and self._decoding_on_cpu(q):  # the same bits in any batch
            lengths = prefix_lengths(mask)
            if lengths is not None:
                return each_sentence(q, k, v, lengths, causal=causal, scale=self.scale, bias=bias)
        # the queries are the last T of L positions; one new query may see every key
        allowed = self_attention_mask(mask, causal=causal and q.size(2) > 1, queries=q.size(2),
                                      keys=k.size(2), device=q.device)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=additive_mask(bias, allowed), dropout_p=self.dropout if self.training else 0.0,
            scale=self.scale,
        )

    def weights(self, x: Tensor, *, mask: Tensor | None = None, causal: bool = False,
                position_bias: Tensor | None = None) -> Tensor:
        """softmax(q k^T / sqrt(d) + bias) over the allowed keys.  x [N, T, D] -> [N, H, T, T]"""
        q, k, _ = (split_heads(t, self.heads) for t in self.qkv(x).chunk(3, dim=-1))  # [N, H, T, d]
        allowed = self_attention_mask(mask, causal=causal, queries=x.size(1), keys=x.size(1),
                                      device=x.device)
        scores = q @ k.transpose(-1, -2) * _scale(self.scale, q)  # [N, H, T, T]
        if position_bias is not None:
            scores = scores + position_bias
        return masked_softmax(scores, allowed)


def _scale(scale: float | None, q: Tensor) -> float:
    """The factor of the logits: ``scale``, or 1/sqrt(d) where it is None."""
    return q.size(-1) ** -0.5 if scale is None else scale


@dataclass
class CrossState:
    """Keys and values of the encoder output, computed once per source.

    ``mask`` is None when no source in the batch is padded (the fused kernels then apply).
    With a wait-k ``lag``, ``lengths`` are the source lengths and ``offset`` the target
    positions decoded so far; ``source``, when the source is still arriving, is where
    more encoder states come from (``lengths`` then counts those read so far).
    """

    k: Tensor  # [B, H, S, d]
    v: Tensor  # [B, H, S, d]
    mask: Tensor | None  # [B, 1, 1, S]
    lag: int = 0
    lengths: Tensor | None = None  # [B]
    offset: int = 0
    source: SourceStream | None = None
    sizes: Tensor | None = None  # [B] real source tokens (every sentence's, lag or not)
    # the native kernel's view of the hypotheses, made at the first step after each change of sentences
    native_rows: Tensor | None = None  # [N, S] each hypothesis's sentence, at every position
    native_sizes: Tensor | None = None  # [N] its source's real tokens

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        if sentences is not None:
            self.native_rows = self.native_sizes = None
            self.k = self.k.index_select(0, sentences)
            self.v = self.v.index_select(0, sentences)
            if self.sizes is not None:
                self.sizes = self.sizes.index_select(0, sentences)
            if self.mask is not None:
                self.mask = self.mask.index_select(0, sentences)
            if self.lengths is not None:
                self.lengths = self.lengths.index_select(0, sentences)

    def visible(self, queries: int) -> Tensor:
        """Which source positions the next ``queries`` target positions of each sentence
        see under wait-k: the first min(i + k, S) for target position i.  -> [B, T, S]"""
        assert self.lengths is not None
        target = self.offset + torch.arange(queries, device=self.k.device)  # [T]
        seen = torch.minimum((target + self.lag).unsqueeze(0), self.lengths.unsqueeze(1))  # [B, T]
        source = torch.arange(self.k.size(2), device=self.k.device)  # [S]
        return source.view(1, 1, -1) < seen.unsqueeze(-1)


def native_view(state: CrossState, n: int, beam: int) -> bool:
    """Makes ``state.native_rows`` [N, S] (each of ``n`` hypotheses' sentence, ``beam`` a
    sentence, at every source position) and ``state.native_sizes`` [N] (its source's real
    tokens) where they are not yet made for ``n`` hypotheses: the native kernel's view of
    the source. Whether it made them now."""
    assert state.sizes is not None
    b, _, s, _ = state.k.shape
    if state.native_rows is not None and state.native_rows.shape == (n, s):
        return False
    sentence = torch.arange(b, device=state.k.device).repeat_interleave(beam)  # [N]
    state.native_rows = sentence.unsqueeze(1).expand(n, s).contiguous()  # [N, S]
    state.native_sizes = state.sizes.repeat_interleave(beam)  # [N]
    return True


class CrossAttention(nn.Module):
    """Multi-head encoder-decoder attention.

    The hypotheses of one sentence share its keys and values: their queries are folded
    into the query axis, so beams never copy the encoder output.
    ``forward(x [N, T, D], state) -> [N, T, D]`` with N a multiple of the state's B.
    """

    def __init__(self, d_model: int, heads: int, *, dropout: float = 0.0, lag: int = 0,
                 head_dim: int | None = None, bias: bool = True, scaled: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = head_dim or d_model // heads
        self.dropout = dropout
        self.scale = None if scaled else 1.0  # None: SDPA's and the kernel's 1/sqrt(d)
        self.lag = lag  # wait-k (model.wait_k); 0: the whole source
        inner = heads * self.head_dim
        self.q, self.kv, self.out = _projections((d_model, inner), (d_model, 2 * inner), (inner, d_model),
                                                 bias=bias)
        for lin in (self.q, self.kv, self.out):
            nn.init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2) if lin is not self.out else 1.0)
        _zero_biases(self.q, self.kv, self.out)

    def prepare(self, memory: Tensor, mask: Tensor) -> CrossState:
        """memory [B, S, D], mask [B, S] (True at real tokens) -> keys and values per head."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # 2 x [B, S, D]
        padded = not bool(mask.all())
        k, v = split_heads(k, self.heads), split_heads(v, self.heads)  # [B, H, S, d]
        if memory.device.type == "cpu" and not self.training and not torch.is_grad_enabled():
            k, v = k.contiguous(), v.contiguous()  # decoding: the native kernel reads them as they lie
        state = CrossState(k, v, key_mask(mask) if padded else None, sizes=mask.sum(1))
        lag = self.current_lag()
        if lag:
            state.lag, state.lengths = lag, mask.sum(1)
        return state

    def current_lag(self) -> int:
        """The wait-k lag of a decoding or batch starting now (:func:`waiting`), else the module's."""
        lag = _LAG.get()
        return self.lag if lag is None else lag

    def follow(self, source: SourceStream, *, like: Tensor) -> CrossState:
        """The state of one hypothesis over a source that arrives while decoding: each step
        reads the source as far as its wait-k lag needs, or to its end without a lag."""
        empty = like.new_zeros(1, self.heads, 0, self.head_dim)
        lag = self.current_lag()
        return CrossState(empty, empty, None, lag=lag, source=source,
                          lengths=torch.zeros(1, dtype=torch.long, device=like.device))

    def _read(self, state: CrossState, queries: int) -> None:
        """Pull encoder states from an arriving source until the last of the next
        ``queries`` target positions sees all it may (lag 0: the whole source)."""
        assert state.source is not None and state.lengths is not None
        wanted = state.offset + queries - 1 + state.lag if state.lag else None
        while state.source is not None and (wanted is None or state.k.size(2) < wanted):
            more = state.source.states_from(state.k.size(2))  # [1, S', D]
            if more is None:
                state.source = None
                break
            k, v = (split_heads(t, self.heads) for t in self.kv(more).chunk(2, dim=-1))
            state.k, state.v = torch.cat([state.k, k], dim=2), torch.cat([state.v, v], dim=2)
        state.lengths = state.lengths.new_full((1,), state.k.size(2))
        if not state.lag:
            state.lag = state.k.size(2)  # everything read: no position is hidden

    def forward(self, x: Tensor, state: CrossState) -> Tensor:
        n, t, _ = x.shape
        if state.source is not None:
            self._read(state, t)
        b = state.k.size(0)
        beam = n // b
        if t == 1 and not state.lag and state.source is None and self._native(x, state):
            return self.out(self._attend_each(x, state, beam))
        q = self.q(x).view(b, beam, t, self.heads, self.head_dim)  # [B, K, T, H, d]
        q = q.permute(0, 3, 1, 2, 4).reshape(b, self.heads, beam * t, -1)  # [B, H, K*T, d]
        mask = state.mask
        if state.lag:
            visible = state.visible(t)  # [B, T, S], within each source's length
            mask = visible.unsqueeze(1).expand(b, beam, t, -1).reshape(b, 1, beam * t, -1)
            state.offset += t
        out = F.scaled_dot_product_attention(
            q, state.k, state.v, attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
        )  # [B, H, K*T, d]
        out = out.view(b, self.heads, beam, t, -1).permute(0, 2, 3, 1, 4)  # [B, K, T, H, d]
        return self.out(out.reshape(n, t, self.heads * self.head_dim))  # [N, T, H*d]

    def _native(self, x: Tensor, state: CrossState) -> bool:
        """Whether this step goes through the native kernel: decoding in float32 on a CPU
        (a fixed choice for a model and machine, whatever the batch)."""
        if self.training or x.device.type != "cpu" or x.dtype != torch.float32 or state.sizes is None:
            return False
        if torch.compiler.is_compiling():  # a compiled step cannot call into the library
            return False
        if not (state.k.dtype == torch.float32 and state.k.is_contiguous() and state.v.is_contiguous()):
            return False
        from seqtrans import native

        return native.available()

    def _attend_each(self, x: Tensor, state: CrossState, beam: int) -> Tensor:
        """One query per hypothesis over its own source's real tokens only, in
        :func:`seqtrans.native.beam_attention`.  x [N, 1, D] -> [N, 1, D]"""
        from seqtrans.native import beam_attention, beam_attention_unchecked

        n, s = x.size(0), state.k.size(2)
        q = self.q(x).reshape(n, self.heads, self.head_dim).contiguous()  # [N, H, d]
        # checked once, when the rows and lengths are new
        attend = beam_attention if native_view(state, n, beam) else beam_attention_unchecked
        assert state.native_rows is not None
        out = attend(q, state.k, state.v, state.native_rows, s, group=beam,
                     lengths=state.native_sizes, scale=self.scale)  # [N, H, d]
        return out.view(n, 1, self.heads * self.head_dim)  # [N, 1, H*d]

    def weights(self, x: Tensor, memory: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, D], memory [B, S, D], mask [B, S] -> [B, H, T, S]"""
        q = split_heads(self.q(x), self.heads)  # [B, H, T, d]
        k = split_heads(self.kv(memory).chunk(2, dim=-1)[0], self.heads)  # [B, H, S, d]
        allowed = key_mask(mask)  # [B, 1, 1, S]
        lag = self.current_lag()
        if lag:
            state = CrossState(k, k, None, lag=lag, lengths=mask.sum(1))
            allowed = allowed & state.visible(x.size(1)).unsqueeze(1)
        return masked_softmax(q @ k.transpose(-1, -2) * _scale(self.scale, q), allowed)
