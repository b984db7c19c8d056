"""The encoder's per-sentence attention on the CPU (``each_sentence``): sentences of one
length share a call, and each gets the bits of a call of its own, whether the sentences
of a length are neighbours in the batch or scattered through it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqtrans.attention.common import each_sentence


def one_call_each(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                  causal: bool) -> torch.Tensor:
    """A call per sentence for its real queries and one for its padded ones."""
    out = torch.zeros_like(q)
    for i, n in enumerate(lengths):
        if not n:
            continue
        keys, values = k[i : i + 1, :, :n], v[i : i + 1, :, :n]
        out[i : i + 1, :, :n] = F.scaled_dot_product_attention(q[i : i + 1, :, :n], keys, values,
                                                               is_causal=causal)
        if n < q.size(2):
            out[i : i + 1, :, n:] = F.scaled_dot_product_attention(q[i : i + 1, :, n:], keys, values)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[9, 9, 7, 7, 7, 3, 0], [7, 3, 9, 7, 0, 3, 9, 7]])
def test_sentences_of_one_length_share_a_call_with_the_bits_of_their_own(lengths: list[int],
                                                                         causal: bool) -> None:
    gen = torch.Generator().manual_seed(len(lengths))
    q, k, v = (torch.randn(len(lengths), 4, 9, 16, generator=gen) for _ in range(3))
    shared = each_sentence(q, k, v, lengths, causal=causal)
    assert torch.equal(shared, one_call_each(q, k, v, lengths, causal))
