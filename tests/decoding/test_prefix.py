"""Prefix forcing: a given target prefix is scored, not searched, and decoding goes on
after it; checked against full decoding and against brute force over every output."""

from __future__ import annotations

import pytest
import torch
from test_search import VOCAB, brute_force, sequence_log_probs

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.decoding.beam import sample_search
from seqtrans.decoding.generate import generate
from seqtrans.decoding.sampling import Truncation
from seqtrans.decoding.search import NEG_INF, force_tokens

pytestmark = pytest.mark.usefixtures("no_grad")
CPU = torch.device("cpu")


def test_forcing_keeps_only_the_forced_token_of_forced_rows() -> None:
    log_probs = torch.randn(3, 6)
    out = force_tokens(log_probs.clone(), torch.tensor([4, PAD, 2]))
    assert out[0].tolist() == [NEG_INF] * 4 + [log_probs[0, 4].item(), NEG_INF]
    assert torch.equal(out[1], log_probs[1])
    assert out[2, 2] == log_probs[2, 2] and int(torch.isfinite(out[2]).sum()) == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_greedy_with_its_own_first_tokens_forced_equals_the_full_decode(seed: int) -> None:
    model = tiny_model(vocab=11, seed=seed)
    sources = [[4, 5, 6, 7, EOS], [8, 9, EOS], [10, 4, 4, EOS]]
    src = pad_batch(sources)
    max_len = torch.tensor([6, 6, 6])
    full = [h[0] for h in greedy_search(model, src, max_len=max_len)]
    for m in range(4):  # the same prefix length for all, or less where an output is shorter
        prefixes = [h.tokens[:m] for h in full]
        forced = [h[0] for h in greedy_search(model, src, max_len=max_len, prefixes=pad_batch(prefixes))]
        assert [h.tokens for h in forced] == [h.tokens for h in full]
        assert [h.log_prob for h in forced] == pytest.approx([h.log_prob for h in full], abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_with_any_prefix_returns_the_best_output_that_starts_with_it(seed: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=seed)
    src = torch.tensor([[4, 5, 6, EOS]])
    everything = brute_force(model, src, 3, 0.6)
    best = everything[0][1]
    for prefix in ([], best[:1], best[:2], [6], [5, 5], [3, 6, 4]):
        expected = [(s, y) for s, y in everything if y[: len(prefix)] == prefix]
        hyps = beam_search(model, src, beam=VOCAB**3, alpha=0.6, max_len=torch.tensor([3]), nbest=2,
                           prefixes=pad_batch([prefix]))[0]
        assert [h.tokens for h in hyps] == [y for _, y in expected[:2]], prefix
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected[:2]], abs=1e-4)
        # the forced tokens are scored: the whole output's log-probability, recomputed
        assert hyps[0].log_prob == pytest.approx(float(sequence_log_probs(model, src, [hyps[0].tokens])[0]),
                                                 abs=1e-4)


@pytest.mark.parametrize("seed", [5, 6])
def test_beam_with_its_own_first_tokens_forced_equals_the_full_decode(seed: int) -> None:
    model = tiny_model(vocab=11, seed=seed)
    sources = [[4, 5, 6, 7, EOS], [8, 9, EOS], [6, 6, 6, EOS]]
    config = DecodeConfig(beam=4, nbest=1, max_len_b=2, alpha=0.6)
    full = generate(model, sources, config, device=CPU)
    for m in (1, 2, 3):
        forced = generate(model, sources, config, device=CPU, prefixes=[h[0].tokens[:m] for h in full])
        # a forced beam only drops competitors of the prefix: it cannot do worse
        assert all(f[0].score >= h[0].score - 1e-5 for f, h in zip(forced, full))
        assert [h[0].tokens for h in forced] == [h[0].tokens for h in full]


def test_a_prefix_longer_than_the_maximum_length_is_still_forced_whole() -> None:
    model = tiny_model(vocab=11, seed=1)
    prefix = [4, 5, 6, 7, 8, 9]
    for config in (DecodeConfig(beam=1, max_len_b=1), DecodeConfig(beam=3, max_len_b=1),
                   DecodeConfig(sample=4, max_len_b=1)):
        hyps = generate(model, [[4, EOS], [5, EOS]], config, device=CPU, prefixes=[prefix, []])
        assert all(h.tokens == prefix for h in hyps[0]) and hyps[0]
        assert all(len(h.tokens) <= 2 for h in hyps[1]) and hyps[1]


def test_every_sample_starts_with_the_prefix() -> None:
    model = tiny_model(vocab=11, seed=2)
    hyps = generate(model, [[4, 5, 6, EOS]], DecodeConfig(sample=16, max_len_b=4, temperature=2.0),
                    device=CPU, prefixes=[[7, 7]])[0]
    assert len(hyps) == 16 and all(h.tokens[:2] == [7, 7] for h in hyps)
    assert len({tuple(h.tokens) for h in hyps}) > 1


def _first_token_log_prob(model: torch.nn.Module, src: torch.Tensor, token: int) -> float:
    """log P(token | x) as the first output token, recomputed."""
    logits = model(src, torch.tensor([[BOS]]))  # [1, 1, V]
    return float(torch.log_softmax(logits.float(), dim=-1)[0, 0, token])


@pytest.mark.parametrize("seed", [0, 1])
def test_given_tokens_are_read_not_scored_and_the_best_outputs_that_start_with_them_win(seed: int) -> None:
    """A family's forced first token: read, not scored (transformers counts it 0), so every
    output's score is its log-probability after that token, over the length with it."""
    model = tiny_model(vocab=VOCAB, seed=seed)
    src = torch.tensor([[4, 5, 6, EOS]])
    for given in ([6], [3]):
        first = _first_token_log_prob(model, src, given[0])
        outputs = [y for _, y in brute_force(model, src, 3, 0.6) if y[:1] == given]
        lp = [((5 + len(y) + 1) / 6) ** 0.6 for y in outputs]  # GNMT's, counting the given token
        expected = sorted(((float(whole) - first) / n, y)
                          for whole, n, y in zip(sequence_log_probs(model, src, outputs), lp, outputs))[::-1]
        hyps = beam_search(model, src, beam=VOCAB**3, alpha=0.6, max_len=torch.tensor([3]), nbest=2,
                           prefixes=pad_batch([given]), given=1)[0]
        assert [h.tokens for h in hyps] == [y for _, y in expected[:2]]
        assert [h.score for h in hyps] == pytest.approx([s for s, _ in expected[:2]], abs=1e-4)
        whole = float(sequence_log_probs(model, src, [hyps[0].tokens])[0])
        assert hyps[0].log_prob == pytest.approx(whole - first, abs=1e-4)


class _Counting:
    """A model that counts the steps it is asked to score and the tokens it only reads."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.scored, self.read = model, 0, 0

    def eval(self) -> None:
        self.model.eval()

    def encode(self, src: torch.Tensor) -> object:
        return self.model.encode(src)

    def start(self, encoded: object, *, beam: int = 1, capacity: int = 64) -> object:
        return self.model.start(encoded, beam=beam, capacity=capacity)

    def decode(self, tokens: torch.Tensor, encoded: object = None, *, state: object = None) -> torch.Tensor:
        self.scored += 1
        return self.model.decode(tokens, encoded, state=state)

    def advance(self, tokens: torch.Tensor, *, state: object) -> None:
        self.read += 1
        self.model.advance(tokens, state=state)


@pytest.mark.parametrize("search", ["greedy", "beam", "sample"])
def test_a_given_token_is_never_scored_and_the_rest_is_the_forced_decode(search: str) -> None:
    model = tiny_model(vocab=11, seed=3)
    src = pad_batch([[4, 5, 6, 7, EOS], [8, 9, EOS]])
    max_len, prefixes = torch.tensor([5, 5]), pad_batch([[7], [7]])
    uniforms = torch.rand(2, 6, generator=torch.Generator().manual_seed(0))
    run = {"greedy": lambda m, **k: greedy_search(m, src, max_len=max_len, **k),
           "beam": lambda m, **k: beam_search(m, src, beam=3, alpha=0.0, max_len=max_len, **k),
           "sample": lambda m, **k: sample_search(m, src, max_len=max_len, truncation=Truncation(),
                                                  uniforms=uniforms, **k)}[search]
    counting = _Counting(model)
    read = run(counting, prefixes=prefixes, given=1)
    scored = run(model, prefixes=prefixes)
    assert counting.read == 1 and counting.scored == max(len(h[0].tokens) for h in read)  # every other step
    assert [h[0].tokens for h in read] == [h[0].tokens for h in scored]
    firsts = [_first_token_log_prob(model, src[b: b + 1], 7) for b in range(2)]
    assert [h[0].log_prob for h in read] == pytest.approx([h[0].log_prob - f for h, f in zip(scored, firsts)],
                                                          abs=1e-4)


def test_given_tokens_need_a_prefix_of_that_many_for_every_source() -> None:
    model = tiny_model(vocab=11, seed=3)
    src = pad_batch([[4, 5, EOS], [8, 9, EOS]])
    with pytest.raises(ValueError, match="2 given tokens"):
        greedy_search(model, src, max_len=torch.tensor([4, 4]), prefixes=pad_batch([[7, 7], [7]]), given=2)
    with pytest.raises(ValueError, match="1 given tokens"):
        beam_search(model, src, beam=2, alpha=0.0, max_len=torch.tensor([4, 4]), given=1)
