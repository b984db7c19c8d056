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
from dataclasses import dataclass

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
        ordered, order = x.sort(dim=1, descending=True)  # [N, V] each
        probs = ordered.exp()
        before = probs.cumsum(dim=1) - probs  # mass of the more probable tokens
        drop_sorted = before >= truncation.top_p  # the first token has 0 before it: always kept
        drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)  # back to vocabulary order
        x = F.log_softmax(x.masked_fill(drop, NEG_INF), dim=-1)
    if truncation.epsilon > 0.0:
        drop = (x < math.log(truncation.epsilon)) & (x < x.max(dim=1, keepdim=True).values)
        x = F.log_softmax(x.masked_fill(drop, NEG_INF), dim=-1)
    return x.nan_to_num(nan=NEG_INF, neginf=NEG_INF)  # rows with nothing allowed: log_softmax of all -inf


def draw(log_probs: Tensor, uniforms: Tensor) -> Tensor:
    """The token of each row whose cumulative probability first exceeds its uniform
    number u in [0, 1) (inverse transform sampling): token i with probability p_i.
    A row with no finite entry gets an arbitrary token; the caller drops it.

    log_probs [N, V], uniforms [N] -> tokens [N]
    """
    probs = log_probs.exp()  # [N, V]
    cdf = probs.cumsum(dim=1)  # [N, V]
    target = uniforms.to(cdf.dtype) * cdf[:, -1]  # the total absorbs the rounding of the sum
    token = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)  # [N, 1] -> [N]
    # where rounding puts the target at the total, the last token with any probability
    last = probs.size(1) - 1 - probs.gt(0).flip(1).int().argmax(dim=1)  # [N]
    return torch.minimum(token, last)


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
