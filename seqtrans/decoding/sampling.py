"""The pure math of sampling: truncating a next-token distribution (temperature, top-k,
top-p, epsilon), drawing from it by inverse transform, and the random stream of each
input, seeded by the input's position alone so that its samples do not depend on the
inputs decoded beside it.

Shapes: N rows (hypotheses), V vocabulary, B inputs, n samples per input, L steps.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Truncation:
    """How the model's distribution is reshaped before a token is drawn, in this order:
    divide the log-probabilities by ``temperature``; keep the ``top_k`` most probable
    tokens (0: all); keep the smallest set of most probable tokens whose probability
    reaches ``top_p`` (Holtzman et al. 2020; 1: all); drop tokens whose probability is
    below ``epsilon`` (Hewitt et al. 2022; 0: none). Each step renormalises what it
    keeps, and the most probable token is always kept."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0


def truncate(log_probs: Tensor, truncation: Truncation) -> Tensor:
    """The log-probabilities of the distribution to sample from: -inf outside the kept
    tokens, a row with no finite entry left as it is.  [N, V] -> [N, V] float32"""
    x = F.log_softmax(log_probs.float() / truncation.temperature, dim=-1)  # [N, V]
    v = x.size(1)
    if 0 < truncation.top_k < v:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep.scatter_(1, x.topk(truncation.top_k, dim=1).indices, True)  # [N, k] -> [N, V]
        x = F.log_softmax(x.masked_fill(~keep, NEG_INF), dim=-1)
    if truncation.top_p < 1.0:
        x = F.log_softmax(x.masked_fill(_outside_nucleus(x, truncation.top_p), NEG_INF), dim=-1)
    if truncation.epsilon > 0.0:
        drop = (x < math.log(truncation.epsilon)) & (x < x.max(dim=1, keepdim=True).values)
        x = F.log_softmax(x.masked_fill(drop, NEG_INF), dim=-1)
    empty = ~torch.isfinite(x.amax(dim=1))  # [N] rows with nothing allowed: log_softmax gave NaN
    if bool(empty.any()):
        x[empty] = NEG_INF
    return x


#: Tokens first searched for the nucleus; a row whose most probable tokens do not reach
#: top_p (a flat distribution) is sorted whole.
_NUCLEUS_FIRST = 64


def _outside_nucleus(x: Tensor, top_p: float) -> Tensor:
    """[N, V] bool: the tokens outside the smallest set of most probable tokens whose
    probability reaches ``top_p`` (``x``: normalised log-probabilities [N, V]). A token is
    kept while the mass of the tokens more probable than it is below ``top_p``; so the
    first token always is, and once the k most probable reach ``top_p`` no other is."""
    ordered, order = x.topk(min(_NUCLEUS_FIRST, x.size(1)), dim=1)  # [N, k], most probable first
    outside = _beyond(ordered, order, top_p, torch.ones_like(x, dtype=torch.bool))
    flat = ordered.exp().sum(dim=1).lt(top_p).nonzero().squeeze(1)  # rows whose nucleus is wider
    if flat.numel():
        ordered, order = x[flat].sort(dim=1, descending=True)  # [F, V]
        outside[flat] = _beyond(ordered, order, top_p, torch.ones_like(ordered, dtype=torch.bool))
    return outside


def _beyond(ordered: Tensor, order: Tensor, top_p: float, out: Tensor) -> Tensor:
    """``out`` with, at the tokens ``order`` (probabilities ``ordered``, most probable
    first), whether the mass before each reaches ``top_p``."""
    probs = ordered.exp()
    before = probs.cumsum(dim=1) - probs  # mass of the more probable tokens
    return out.scatter_(1, order, before >= top_p)


def draw(log_probs: Tensor, uniforms: Tensor) -> Tensor:
    """The token of each row whose cumulative probability first exceeds its uniform
    number u in [0, 1) (inverse transform sampling): token i with probability p_i.
    ``log_probs`` need not be normalised. A row with no finite entry gets an arbitrary
    token; the caller drops it.

    log_probs [N, V], uniforms [N] -> tokens [N]
    """
    probs = log_probs.exp()  # [N, V]
    cdf = probs.cumsum(dim=1)  # [N, V]
    target = uniforms.to(cdf.dtype) * cdf[:, -1]  # the total absorbs the rounding of the sum
    token = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)  # [N, 1] -> [N]
    # where rounding puts the target at the total, no entry of the cdf exceeds it: then the
    # last token with any probability
    past = token >= probs.size(1)  # [N]
    if bool(past.any()):
        rows = probs[past]
        token[past] = rows.size(1) - 1 - rows.gt(0).flip(1).int().argmax(dim=1)
    return token


def sample(log_probs: Tensor, truncation: Truncation, uniforms: Tensor) -> Tensor:
    """One token per row drawn from ``truncate(log_probs, truncation)`` with the rows'
    uniform numbers, by the cheapest route to the same distribution: the model's own
    distribution needs no reshaping (:func:`draw` normalises), and with ``top_k`` only the
    k most probable tokens are reshaped and drawn from.

    log_probs [N, V], uniforms [N] -> tokens [N]
    """
    x = log_probs.float()
    if truncation == Truncation():
        return draw(x, uniforms)
    if 0 < truncation.top_k < x.size(1):
        top, index = x.topk(truncation.top_k, dim=1)  # [N, k]: the order of x / temperature too
        index, order = index.sort(dim=1)  # in vocabulary order, so a uniform picks the same token
        kept = truncate(top.gather(1, order), replace(truncation, top_k=0))  # [N, k]
        return index.gather(1, draw(kept, uniforms).unsqueeze(1)).squeeze(1)
    return draw(truncate(x, truncation), uniforms)


def stream_seed(seed: int, index: int) -> int:
    """The seed of input ``index``'s random stream under ``decode.seed`` ``seed``: a hash,
    so that nearby seeds and indices give unrelated streams."""
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def input_uniforms(seed: int, indices: Sequence[int], *, samples: int, steps: Sequence[int]) -> Tensor:
    """The uniform numbers each sample of each input uses, one per step: input
    ``indices[b]`` draws its ``samples`` x ``steps[b]`` numbers from its own stream, so
    they depend on its index and its own length only. Padded to the longest.

    -> [B*n, L] (rows input by input, its samples in turn)
    """
    longest = max(steps, default=0)
    rows = []
    for index, length in zip(indices, steps):
        generator = torch.Generator().manual_seed(stream_seed(seed, index))
        own = torch.rand(samples, length, generator=generator)  # [n, L_b]
        rows.append(F.pad(own, (0, longest - length)))  # [n, L]
    return torch.cat(rows) if rows else torch.empty(0, longest)
