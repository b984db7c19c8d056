"""A sentence decodes to the same bits alone as in any batch (docs/concepts.md): its
log-probability, a float compared bit for bit, is the same in batches of 1, 7 and 32,
in fp32 and int8, with greedy and beam search. The sources have different lengths, so
each batch pads them; a product or attention whose order of summation depended on the
rows beside a sentence, or on their padding, changes the last bits of its score."""

from __future__ import annotations

import pytest
import torch

from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.data.vocab import EOS
from seqtrans.decoding.generate import generate
from seqtrans.model.transformer import Transformer

VOCAB = 120


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=128, heads=4, dropout=0.0)
    return Transformer(config, source_vocab_size=VOCAB, target_vocab_size=VOCAB, shared_vocab=True).eval()


@pytest.fixture(scope="module")
def sources() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 18, (32,), generator=g).tolist()
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() + [EOS] for n in lengths]


def decode_in_batches(model: Transformer, sources: list[list[int]], size: int, *, precision: str,
                      beam: int) -> tuple[list[list[int]], torch.Tensor]:
    """The best output of each source and its log-probability, decoding ``size`` sources at a time."""
    config = DecodeConfig(beam=beam, precision=precision, batch_tokens=10**6, max_len_a=1.0, max_len_b=4)
    best = []
    with torch.no_grad():
        for start in range(0, len(sources), size):
            best += [hyps[0] for hyps in generate(model, sources[start:start + size], config,
                                                  device=torch.device("cpu"))]
    return [h.tokens for h in best], torch.tensor([h.log_prob for h in best], dtype=torch.float64)


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_sentence_decodes_to_the_same_bits_in_batches_of_1_7_and_32(
        model: Transformer, sources: list[list[int]], precision: str, beam: int) -> None:
    assert len({len(s) for s in sources}) > 8  # batches are padded
    tokens, alone = decode_in_batches(model, sources, 1, precision=precision, beam=beam)
    assert len({len(t) for t in tokens}) > 1 and len(set(alone.tolist())) == len(sources)
    for size in (7, 32):
        tokens_in_batch, in_batch = decode_in_batches(model, sources, size, precision=precision, beam=beam)
        assert tokens_in_batch == tokens
        assert torch.equal(in_batch, alone), f"batch of {size}: {(in_batch != alone).sum()} scores differ"
