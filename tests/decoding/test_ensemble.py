"""Ensembles against brute force: beam search over the renormalised weighted mean of the
members' log-probabilities, computed here by teacher-forced recomputation of each member."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from test_search import BODY, VOCAB, assert_decodes_alone_as_among_longer_ones, mechanism_model

from conftest import tiny_model
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.model.transformer import Transformer

pytestmark = pytest.mark.usefixtures("no_grad")


def ensemble_log_probs(models: list[Transformer], weights: list[float], src: torch.Tensor,
                       outputs: list[list[int]]) -> torch.Tensor:
    """log P(y EOS | x) under the ensemble: at every position the weighted mean of the
    members' log-softmax, renormalised; each member recomputes the whole prefix."""
    tgt_in = pad_batch([[BOS, *y] for y in outputs])
    tgt_out = pad_batch([[*y, EOS] for y in outputs])
    mean = sum(w / sum(weights) * F.log_softmax(m(src.expand(len(outputs), -1), tgt_in).double(), dim=-1)
               for m, w in zip(models, weights))
    logp = F.log_softmax(mean, dim=-1)  # type: ignore[arg-type]
    tok = logp.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)
    return tok.masked_fill(tgt_out.eq(PAD), 0.0).sum(dim=1)


def brute_force(models: list[Transformer], weights: list[float], src: torch.Tensor, max_len: int,
                alpha: float) -> list[tuple[float, float, list[int]]]:
    """(score, log-probability, output) of every output of at most ``max_len`` tokens, best first."""
    outputs = [list(y) for n in range(max_len + 1) for y in itertools.product(BODY, repeat=n)]
    logp = ensemble_log_probs(models, weights, src, outputs)
    scored = [(float(lp) / ((5 + len(y) + 1) / 6) ** alpha, float(lp), y) for lp, y in zip(logp, outputs)]
    return sorted(scored, key=lambda s: -s[0])


# members of different architectures: widths, depths, attention kinds, a model extension
MEMBERS = {
    "plain": {},
    "extended": {"extension": True},
    "narrow-memory": {"d_model": 8, "d_ff": 16, "heads": 2, "decoder_layers": 1, "cross_attention": "memory",
                      "memory_slots": 3},
    "monotonic-pre": {"cross_attention": "monotonic", "monotonic_r_init": 0.3, "norm": "pre"},
}


@pytest.mark.parametrize(("names", "weights", "alpha"), [
    (("plain", "plain"), [1.0, 1.0], 0.6),
    (("plain", "extended"), [1.0, 3.0], 0.0),
    (("plain", "narrow-memory", "monotonic-pre"), [1.0, 1.0, 1.0], 1.0),
    (("extended", "narrow-memory", "plain"), [0.2, 0.5, 0.3], 0.6),
])
def test_wide_beam_of_an_ensemble_returns_the_brute_force_best(names: tuple[str, ...], weights: list[float],
                                                               alpha: float) -> None:
    models = [mechanism_model(MEMBERS[name], seed=10 + i) for i, name in enumerate(names)]
    src = torch.tensor([[4, 5, 6, EOS]])
    max_len = 3
    expected = brute_force(models, weights, src, max_len, alpha)
    hyps = beam_search(Ensemble(models, weights), src, beam=VOCAB**max_len, alpha=alpha,
                       max_len=torch.tensor([max_len]), nbest=5)[0]
    assert [h.tokens for h in hyps] == [y for _, _, y in expected[:5]]
    for h, (score, log_prob, _) in zip(hyps, expected):
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.log_prob == pytest.approx(log_prob, abs=1e-4)
    # the members disagree: the ensemble's best is not simply the first member's
    alone = brute_force(models[:1], [1.0], src, max_len, alpha)
    assert [y for _, _, y in alone[:5]] != [y for _, _, y in expected[:5]]


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensemble_of_one_model_decodes_exactly_as_the_model(beam: int) -> None:
    model = tiny_model(vocab=11, seed=3)
    src = pad_batch([[4, 5, 6, EOS], [7, 8, EOS]])
    max_len = torch.tensor([9, 9])

    def decode(m: Transformer | Ensemble) -> list:
        if beam == 1:
            return greedy_search(m, src, max_len=max_len)
        return beam_search(m, src, beam=beam, alpha=0.6, max_len=max_len, nbest=beam)

    assert decode(Ensemble([model])) == decode(model)  # tokens, log-probabilities and scores, exactly


def test_an_ensemble_of_a_model_with_itself_gives_the_models_outputs_and_scores() -> None:
    model = tiny_model(vocab=11, seed=4, extension=True)
    src = pad_batch([[4, 5, 6, EOS], [7, 8, 6, 4, EOS]])
    max_len = torch.tensor([9, 9])
    alone = beam_search(model, src, beam=4, alpha=0.6, max_len=max_len, nbest=4)
    twice = beam_search(Ensemble([model, model], [0.3, 0.7]), src, beam=4, alpha=0.6, max_len=max_len,
                        nbest=4)
    for a, b in zip(alone, twice):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        for x, y in zip(a, b):
            assert x.log_prob == pytest.approx(y.log_prob, abs=1e-5)
            assert x.score == pytest.approx(y.score, abs=1e-5)


@pytest.mark.parametrize("beam", [1, 4])
def test_an_ensembles_sentence_decodes_the_same_alone_or_among_longer_ones(beam: int) -> None:
    ensemble = Ensemble([mechanism_model(MEMBERS["extended"], seed=20, vocab=11),
                         mechanism_model(MEMBERS["narrow-memory"], seed=21, vocab=11)])
    assert_decodes_alone_as_among_longer_ones(ensemble, beam)


def test_ensemble_weights_are_checked() -> None:
    model = tiny_model(vocab=11)
    with pytest.raises(ValueError, match="2 weights for 1 models"):
        Ensemble([model], [1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        Ensemble([model, model], [1.0, -1.0])
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])


def test_an_ensembles_cached_steps_equal_its_teacher_forced_recomputation() -> None:
    names = ("extended", "narrow-memory", "monotonic-pre")
    models = [mechanism_model(MEMBERS[name], seed=30 + i, vocab=11) for i, name in enumerate(names)]
    ensemble = Ensemble(models, [0.5, 0.3, 0.2])
    src = pad_batch([[4, 5, 6, EOS], [7, 8, EOS]])
    tgt_in = torch.tensor([[BOS, 4, 6, 5, 4], [BOS, 6, 6, 4, 7]])
    full = F.log_softmax(ensemble(src, tgt_in), dim=-1)  # [B, T, V]
    state = ensemble.start(ensemble.encode(src), beam=1, capacity=8)
    steps = torch.cat([ensemble.decode(tgt_in[:, t : t + 1], state=state)  # one token at a time, cached
                       for t in range(tgt_in.size(1))], dim=1)
    torch.testing.assert_close(F.log_softmax(steps, dim=-1), full, atol=1e-5, rtol=0)
