"""Rules every output keeps (decode.min_len, decode.no_repeat_ngram_size) against brute
force: the banned tokens against a loop over plain lists, and beam, greedy and sampling
against every output of a tiny model."""

from __future__ import annotations

import random

import pytest
import torch
from test_search import BODY, VOCAB, brute_force

from conftest import tiny_model
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.decoding.generate import generate
from seqtrans.decoding.search import banned_phrase_tokens, repeated_ngrams
from seqtrans.errors import ConfigError

pytestmark = pytest.mark.usefixtures("no_grad")


def repeats(y: list[int], size: int) -> bool:
    """Whether ``y`` holds an n-gram of ``size`` tokens twice."""
    grams = [tuple(y[i : i + size]) for i in range(len(y) - size + 1)]
    return len(grams) != len(set(grams))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_banned_tokens_are_those_that_would_repeat_an_ngram(size: int) -> None:
    rng = random.Random(size)
    for t in range(0, 9):
        rows = [[rng.choice([4, 5, 6]) for _ in range(t)] for _ in range(6)]
        banned = repeated_ngrams(torch.tensor(rows, dtype=torch.long).view(6, t), size, VOCAB)
        for row, got in zip(rows, banned.tolist()):
            grams = {tuple(row[i : i + size]) for i in range(len(row) - size + 1)}
            expected = [(*row[len(row) - size + 1 :], v) in grams for v in range(VOCAB)]
            assert got == expected, (row, size)


@pytest.mark.parametrize("size", [1, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wide_beam_returns_the_best_output_without_a_repeated_ngram(size: int, seed: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=seed)
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    max_len, alpha = 3, 2.0
    everything = brute_force(model, src, max_len, alpha)
    allowed = [(s, y) for s, y in everything if not repeats(y, size)]
    hyps = beam_search(model, src, beam=VOCAB**max_len, alpha=alpha, max_len=torch.tensor([max_len]), nbest=3,
                       no_repeat_ngram_size=size)[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:3]]
    assert [h.score for h in hyps] == pytest.approx([s for s, _ in allowed[:3]], abs=1e-4)


def test_the_rule_changes_the_search_result_for_the_models_above() -> None:
    # the test above is only worth something if the best outputs repeat without the rule
    tops = [brute_force(tiny_model(vocab=VOCAB, seed=seed), torch.tensor([[4, 5, 6, 4, EOS]]), 3, 2.0)[:3]
            for seed in (0, 1, 2)]
    assert any(repeats(y, 1) for top in tops for _, y in top)
    assert any(repeats(y, 2) for top in tops for _, y in top)


@pytest.mark.parametrize("min_len", [1, 2, 3])
def test_wide_beam_returns_the_best_output_of_at_least_the_minimum_length(min_len: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=3)
    src = torch.tensor([[5, 6, EOS]])
    allowed = [(s, y) for s, y in brute_force(model, src, 3, 0.0) if len(y) >= min_len]
    hyps = beam_search(model, src, beam=VOCAB**3, alpha=0.0, max_len=torch.tensor([3]), nbest=2,
                       min_len=min_len)[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:2]]
    greedy = greedy_search(model, src, max_len=torch.tensor([3]), min_len=min_len)[0][0]
    assert len(greedy.tokens) >= min_len


def test_greedy_takes_the_best_token_that_repeats_no_ngram() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    src = torch.tensor([[4, 4, 4, 4, 4, EOS]])
    prefix: list[int] = []
    for _ in range(8):  # step-by-step argmax by full recomputation, banned tokens excluded
        logits = model(src, torch.tensor([[BOS, *prefix]]))[0, -1]
        logits[[PAD, BOS]] = float("-inf")
        for v in BODY:
            if repeats([*prefix, v], 2):
                logits[v] = float("-inf")
        token = int(logits.argmax())
        if token == EOS:
            break
        prefix.append(token)
    hyp = greedy_search(model, src, max_len=torch.tensor([8]), no_repeat_ngram_size=2)[0][0]
    assert hyp.tokens == prefix[:8]


def test_samples_never_repeat_an_ngram() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    config = DecodeConfig(sample=64, max_len_b=6, no_repeat_ngram_size=2, temperature=3.0)
    hyps = generate(model, [[4, 4, 4, EOS]], config, device=torch.device("cpu"))[0]
    assert any(len(h.tokens) >= 4 for h in hyps)
    assert not any(repeats(h.tokens, 2) for h in hyps)
    free = generate(model, [[4, 4, 4, EOS]], DecodeConfig(sample=64, max_len_b=6, temperature=3.0),
                    device=torch.device("cpu"))[0]
    assert any(repeats(h.tokens, 2) for h in free)


def test_a_negative_ngram_size_names_its_key() -> None:
    with pytest.raises(ConfigError, match="decode.no_repeat_ngram_size"):
        DecodeConfig(no_repeat_ngram_size=-1)


def contains(y: list[int], phrase: list[int]) -> bool:
    return any(y[i : i + len(phrase)] == phrase for i in range(len(y) - len(phrase) + 1))


def test_banned_phrase_tokens_are_those_that_would_complete_a_phrase() -> None:
    rng = random.Random(7)
    for _ in range(40):
        rows = [[rng.choice([4, 5, 6]) for _ in range(5)] for _ in range(4)]
        phrases = [[[rng.choice([4, 5, 6]) for _ in range(rng.randint(1, 3))] for _ in range(2)]
                   for _ in rows]
        banned = banned_phrase_tokens(torch.tensor(rows), phrases, VOCAB)
        for row, own, got in zip(rows, phrases, banned.tolist()):
            expected = [any([*row, v][-len(p):] == p for p in own) for v in range(VOCAB)]
            assert got == expected, (row, own)


# overlapping phrases, a repeated one, a single token
BANNED = [[[5, 4]], [[4, 4], [4, 4, 5]], [[6]], [[4, 6], [6, 4], [4, 6]]]


@pytest.mark.parametrize("phrases", BANNED, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_wide_beam_returns_the_best_output_without_a_banned_phrase(phrases: list[list[int]],
                                                                  seed: int) -> None:
    model = tiny_model(vocab=VOCAB, seed=seed)
    src = torch.tensor([[4, 5, 6, 4, EOS]])
    everything = brute_force(model, src, 3, 1.0)
    allowed = [(s, y) for s, y in everything if not any(contains(y, p) for p in phrases)]
    hyps = beam_search(model, src, beam=VOCAB**3, alpha=1.0, max_len=torch.tensor([3]), nbest=3,
                       banned=[phrases])[0]
    assert [h.tokens for h in hyps] == [y for _, y in allowed[:3]]
    greedy = greedy_search(model, src, max_len=torch.tensor([3]), banned=[phrases])[0]
    assert all(not any(contains(h.tokens, p) for p in phrases) for h in greedy)


def test_each_source_keeps_its_own_banned_phrases_in_a_batch() -> None:
    model = tiny_model(vocab=VOCAB, seed=1)
    sources = [[4, 5, 6, 4, EOS], [5, 5, EOS], [6, 4, EOS]]
    max_len = torch.tensor([4, 4, 4])
    free = beam_search(model, pad_batch(sources), beam=4, alpha=3.0, max_len=max_len)
    assert all(hyps[0].tokens for hyps in free)
    banned = [[free[0][0].tokens[:1]], [], [free[2][0].tokens[:2]]]  # each bans its own best start
    together = beam_search(model, pad_batch(sources), beam=4, alpha=3.0, max_len=max_len, banned=banned)
    for src, own, hyps in zip(sources, banned, together):
        alone = beam_search(model, torch.tensor([src]), beam=4, alpha=3.0, max_len=torch.tensor([4]),
                            banned=[own])[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert all(not any(contains(h.tokens, p) for p in own) for h in hyps)
    assert [h.tokens for h in free[1]] == [h.tokens for h in together[1]]  # no phrase: as without the rule
    assert together[0][0].tokens != free[0][0].tokens and together[2][0].tokens != free[2][0].tokens
