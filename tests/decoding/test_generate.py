"""Decoding many inputs: order restored, nothing dropped, batches bounded."""

from __future__ import annotations

import torch

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS
from seqtrans.decoding.beam import beam_search
from seqtrans.decoding.generate import generate, length_batches, max_output_length


def test_length_batches_cover_every_index_once_within_the_budget() -> None:
    lengths = [5, 1, 9, 3, 3, 7, 2, 30]
    batches = list(length_batches(lengths, 12))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 12


def test_max_output_length_is_a_x_plus_b() -> None:
    c = DecodeConfig(max_len_a=1.0, max_len_b=50)
    assert max_output_length(10, c) == 60
    assert max_output_length(10, DecodeConfig(max_len_a=1.5, max_len_b=3)) == 18
    assert max_output_length(10, c, limit=20) == 20


def test_generate_returns_results_in_input_order() -> None:
    model = tiny_model(vocab=11, seed=1)
    sources = [[4, 5, 6, 7, 8, 9, EOS], [EOS], [5, EOS], [9, 8, 7, EOS]]
    config = DecodeConfig(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=4, nbest=2, batch_tokens=8)
    out = generate(model, sources, config, device=torch.device("cpu"))
    for src, hyps in zip(sources, out):
        single = beam_search(model, pad_batch([src]), beam=3, alpha=0.6,
                             max_len=torch.tensor([len(src) - 1 + 4]), nbest=2)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in single]


def test_bf16_precision_decodes_under_autocast_with_close_scores() -> None:
    """decode.precision=bf16 really runs in bfloat16 (scores move by rounding) and stays close."""
    model = tiny_model(vocab=11, seed=1)
    sources = [[4, 5, 6, 7, 8, 9, EOS], [9, 8, 7, EOS]]
    fp32 = generate(model, sources, DecodeConfig(beam=1, min_len=3, max_len_b=3), device=torch.device("cpu"))
    bf16 = generate(model, sources, DecodeConfig(beam=1, min_len=3, max_len_b=3, precision="bf16"),
                    device=torch.device("cpu"))
    for a, b in zip(fp32, bf16):
        assert a[0].score != b[0].score
        assert abs(a[0].score - b[0].score) < 0.05 * abs(a[0].score) + 0.05
