"""The Transformer: causality, padding independence, the cache, shapes and sizes."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_alone_as_among_others, assert_cached_as_full, assert_causal, src_batch, tiny_model
from seqtrans.config import PRESETS, ModelConfig
from seqtrans.data.vocab import BOS, EOS
from seqtrans.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures("no_grad")


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_future_target_tokens_do_not_change_earlier_outputs(norm: str, positions: str) -> None:
    assert_causal(tiny_model(norm=norm, positions=positions))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_padding_and_batch_mates_do_not_change_a_sentence(norm: str) -> None:
    assert_alone_as_among_others(tiny_model(norm=norm))


@pytest.mark.parametrize("positions, extension",
                         [("sinusoidal", False), ("learned", False), ("sinusoidal", True), ("learned", True)])
def test_incremental_decoding_with_cache_equals_full_recomputation(positions: str, extension: bool) -> None:
    model = tiny_model(positions=positions, extension=extension)
    src = src_batch()
    # 4 is the token the extension counts
    tgt = torch.tensor([[BOS, 4, 5, 6, 7, 8], [BOS, 5, 4, 5, 6, 4], [BOS, 6, 5, 5, 4, 6]])
    src = torch.cat([src, src[:1]])
    assert_cached_as_full(model, src, tgt, split=3)


def test_shared_vocabulary_ties_embeddings_and_output() -> None:
    model = tiny_model()
    assert model.source_embed is model.target_embed
    assert model.output is None  # logits use the target embedding matrix
    untied = Transformer(ModelConfig(d_model=16, d_ff=32, heads=4, encoder_layers=1, decoder_layers=1,
                                     tie_output=False),
                         source_vocab_size=9, target_vocab_size=7, shared_vocab=False)
    assert untied.source_embed is not untied.target_embed
    assert untied.output is not None and untied.output.weight.shape == (7, 16)


def test_embeddings_are_scaled_by_sqrt_d_model() -> None:
    model = tiny_model(encoder_layers=1, decoder_layers=1)
    tokens = torch.tensor([[5, 6]])
    x = model._embed(model.source_embed, tokens, 0, source=True)
    expected = model.source_embed.weight[tokens] * 4.0 + model.positions(2, device=tokens.device)
    torch.testing.assert_close(x, expected)


def test_sinusoidal_positions_match_the_paper_formula() -> None:
    model = tiny_model(encoder_layers=1, decoder_layers=1)
    pe = model.positions(5, offset=3, device=torch.device("cpu"))
    for pos in range(3, 8):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos - 3, 2 * i].item() == pytest.approx(torch.tensor(angle).sin().item(), abs=1e-5)
            assert pe[pos - 3, 2 * i + 1].item() == pytest.approx(torch.tensor(angle).cos().item(), abs=1e-5)


def test_a_single_positions_encoding_is_made_once_as_computed_and_again_for_a_cast_table() -> None:
    model = tiny_model(encoder_layers=1, decoder_layers=1)
    cpu = torch.device("cpu")
    row = model.positions(1, offset=6, device=cpu)
    assert torch.equal(row, model.positions(3, offset=5, device=cpu)[1:2])
    assert model.positions(1, offset=6, device=cpu) is row  # a decoding step's: kept
    model.double()
    again = model.positions(1, offset=6, device=cpu)
    assert again.dtype == torch.float64 and torch.equal(again, model.positions(2, offset=6, device=cpu)[:1])


def test_learned_positions_refuse_positions_beyond_their_table() -> None:
    model = tiny_model(positions="learned", max_positions=4)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(torch.tensor([[5, 6, 7, 8, EOS]]))


def test_base_preset_has_the_papers_parameter_count() -> None:
    # Table 3: 65M for base with a shared 37,000-token vocabulary (biases and norms included).
    base = ModelConfig(**PRESETS["base"]["model"])
    with torch.device("meta"):
        model = Transformer(base, source_vocab_size=37000, target_vocab_size=37000, shared_vocab=True)
    params = model.num_parameters()
    print(f"base model, shared 37,000 vocabulary: {params:,} parameters")
    assert 63_000_000 <= params <= 65_000_000
    big = ModelConfig(**PRESETS["big"]["model"])
    with torch.device("meta"):
        model = Transformer(big, source_vocab_size=37000, target_vocab_size=37000, shared_vocab=True)
    assert 209_000_000 <= model.num_parameters() <= 215_000_000  # Table 3: 213M


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_incremental_encoding_equals_encoding_the_whole_source(positions: str) -> None:
    """A causal encoder fed one token, then two, then the rest gives every position the
    state encode() gives it with the whole source at hand."""
    model = tiny_model(causal_encoder=True, positions=positions)
    src = torch.tensor([[5, 6, 7, 8, 9, EOS]])
    with torch.no_grad():
        whole = model.encode(src).memory
        state = model.start_encoding(capacity=2)  # grows past its capacity
        parts = [model.encode_next(src[:, a:b], state) for a, b in ((0, 1), (1, 3), (3, 6))]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert state.length == 6
    with pytest.raises(ValueError, match="causal encoder"):
        tiny_model().start_encoding()
