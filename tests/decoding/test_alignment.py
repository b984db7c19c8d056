"""Word alignments from attention weights (hand-made matrices and a tiny model), and
per-token log-probabilities that sum to what the search reported."""

from __future__ import annotations

import pytest
import torch
from test_search import MECHANISM_OPTIONS, mechanism_model

from conftest import tiny_model
from seqtrans.attention.maps import MemoryWeights, MonotonicWeights
from seqtrans.config import DecodeConfig
from seqtrans.data.vocab import EOS
from seqtrans.decoding.alignment import layer_weights, pharaoh, source_weights, word_alignment
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import generate
from seqtrans.errors import UsageError
from seqtrans.inference.details import attention_weights, with_token_log_probs

pytestmark = pytest.mark.usefixtures("no_grad")
CPU = torch.device("cpu")


def test_each_target_word_goes_with_the_source_word_it_attends_to_most() -> None:
    # 3 target tokens + EOS over 4 source tokens + EOS; the end symbols' weights are ignored
    weights = torch.tensor([[0.1, 0.6, 0.1, 0.1, 0.1],
                            [0.0, 0.0, 0.1, 0.2, 0.7],  # EOS column excluded: token 3
                            [0.5, 0.1, 0.1, 0.2, 0.1],
                            [0.9, 0.0, 0.0, 0.0, 0.1]])  # the target's end symbol: ignored
    pairs = word_alignment(weights, source_words=[0, 0, 1, 2], target_words=[0, 1, 1])
    assert pairs == [(0, 0), (0, 1), (2, 1)]
    assert pharaoh(pairs) == "0-0 0-1 2-1"
    assert word_alignment(weights, source_words=[0, 1, 2, 3], target_words=[]) == []


def test_every_mechanism_s_weights_become_a_distribution_over_source_positions() -> None:
    heads = torch.rand(2, 4, 3, 5).softmax(-1)  # [B, H, T, S]
    assert torch.allclose(source_weights(heads), heads.mean(dim=1))
    memory = MemoryWeights(torch.rand(2, 3, 6).softmax(-1), torch.rand(2, 6, 5).softmax(-1))
    assert torch.allclose(source_weights(memory).sum(-1), torch.ones(2, 3))
    expected = torch.rand(2, 3, 5)
    assert source_weights(MonotonicWeights(torch.zeros(2, 3, dtype=torch.long), expected)) is expected
    layers = [torch.full((1, 2, 3, 5), float(i)) for i in range(3)]
    assert float(layer_weights(layers, layer=None).mean()) == 1.0
    assert float(layer_weights(layers, layer=3).mean()) == 2.0
    with pytest.raises(UsageError, match="alignment layer 4: the model has decoder layers 1 to 3"):
        layer_weights(layers, layer=4)


@pytest.mark.parametrize("name", ["scaled_dot", "memory", "monotonic"])
def test_attention_weights_do_not_depend_on_the_batch(name: str) -> None:
    model = mechanism_model(MECHANISM_OPTIONS[name], seed=1)
    sources = [[4, 5, 6, EOS], [5, EOS], [6, 6, 4, 5, 4, EOS]]
    targets = [[4, 4], [5, 6, 5, 6], []]
    together = attention_weights(model, sources, targets, layer=None, device=CPU, batch_tokens=1000)
    for s, t, w in zip(sources, targets, together):
        assert w.shape == (len(t) + 1, len(s))
        alone = attention_weights(model, [s], [t], layer=2, device=CPU, batch_tokens=1000)[0]
        assert alone.shape == w.shape
        mass = alone.sum(-1)  # monotonic attention may attend nowhere: then its row sums to less than 1
        assert bool((mass <= 1 + 1e-5).all())
        assert name == "monotonic" or torch.allclose(mass, torch.ones(len(t) + 1))
        mean = (attention_weights(model, [s], [t], layer=1, device=CPU, batch_tokens=1000)[0] + alone) / 2
        assert torch.allclose(w, mean, atol=1e-5)


@pytest.mark.parametrize("config", [DecodeConfig(beam=3, nbest=3, max_len_b=3),
                                    DecodeConfig(beam=1, max_len_b=3), DecodeConfig(sample=4, max_len_b=3)],
                         ids=["beam", "greedy", "sample"])
def test_token_log_probs_sum_to_the_log_prob_the_search_reported(config: DecodeConfig) -> None:
    sources = [[4, 5, 6, EOS], [7, 8, EOS]]
    ensemble = Ensemble([tiny_model(vocab=11, seed=1), tiny_model(vocab=11, seed=2)])
    for model in (tiny_model(vocab=11, seed=1), ensemble):
        hyps = generate(model, sources, config, device=CPU)
        assert all(h.token_log_probs is None for nbest in hyps for h in nbest)  # only when asked for
        scored = with_token_log_probs(model, sources, hyps, decode=config, device=CPU)
        for before, after in zip(hyps, scored):
            assert [h.tokens for h in before] == [h.tokens for h in after]
            for h in after:
                assert h.token_log_probs is not None and len(h.token_log_probs) == len(h.tokens) + 1
                assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-4)
                assert all(x <= 0 for x in h.token_log_probs)
