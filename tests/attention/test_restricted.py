"""Restricted self-attention against full attention masked to the neighbourhood."""

from __future__ import annotations

import pytest
import torch

from seqtrans.attention.restricted import RestrictedSelfAttention
from seqtrans.attention.scaled_dot import merge_heads, split_heads


def banded_reference(attn: RestrictedSelfAttention, x: torch.Tensor, mask: torch.Tensor | None,
                     causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) over all keys with |i - j| <= r (j <= i if causal)."""
    q, k, v = (split_heads(t, attn.heads) for t in attn.qkv(x).chunk(3, dim=-1))
    t = x.size(1)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    allowed = (i - j).abs() <= attn.radius
    if causal:
        allowed &= j <= i
    allowed = allowed[None, None]
    if mask is not None:
        allowed = allowed & mask[:, None, None, :]
    scores = (q @ k.transpose(-1, -2)) / q.size(-1) ** 0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return attn.out(merge_heads(weights @ v))


@pytest.mark.parametrize("radius", [1, 2, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_windows_equal_full_attention_restricted_to_the_neighbourhood(radius: int, causal: bool) -> None:
    torch.manual_seed(radius)
    attn = RestrictedSelfAttention(8, 2, radius=radius)
    x = torch.randn(2, 7, 8)
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    with torch.no_grad():
        got = attn(x, mask=mask, causal=causal)
        want = banded_reference(attn, x, mask, causal)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :4], want[1, :4], atol=1e-5, rtol=1e-5)


def test_a_cache_attends_to_the_last_r_positions() -> None:
    torch.manual_seed(0)
    attn = RestrictedSelfAttention(8, 2, radius=2)
    x = torch.randn(3, 9, 8)
    with torch.no_grad():
        full = attn(x, causal=True)
        cache = attn.new_cache(3, 4, like=x)
        steps = [attn(x[:, :4], causal=True, cache=cache)] + [
            attn(x[:, t : t + 1], causal=True, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
