"""Latency metrics: equal to SimulEval 1.1.4's scorers on random delays and edge cases,
and to hand-computed values."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

from seqtrans.streaming.latency import (
    METRICS,
    corpus_latency,
    reference_words,
    sentence_latency,
)

try:
    from simuleval.evaluator.scorers import latency_scorer
except ImportError:  # pragma: no cover - requirements-dev.txt installs it
    latency_scorer = None

needs_simuleval = pytest.mark.skipif(latency_scorer is None,
                                     reason="simuleval==1.1.4 is not installed (see requirements-dev.txt)")


def instance(delays: list[int], source_length: int, reference: str | None) -> Any:
    """What SimulEval's text-to-text scorers read of an instance."""
    return SimpleNamespace(delays=delays, source_length=source_length, reference=reference,
                           reference_length=None if reference is None else len(reference.split(" ")),
                           metrics={})


def simuleval_scores(delays: list[int], source_length: int, reference: str | None) -> dict[str, float]:
    assert latency_scorer is not None
    scorers = {"ap": latency_scorer.APScorer(), "al": latency_scorer.ALScorer(),
               "laal": latency_scorer.LAALScorer(), "dal": latency_scorer.DALScorer()}
    ins = instance(delays, source_length, reference)
    return {name: float(scorer.compute(ins)) for name, scorer in scorers.items()}


def random_delays(rng: random.Random, source_length: int, length: int) -> list[int]:
    return sorted(rng.randint(1, source_length) for _ in range(length))


@needs_simuleval
def test_every_metric_equals_simuleval_on_random_delays() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        source_length = rng.randint(1, 30)
        delays = random_delays(rng, source_length, rng.randint(1, 40))
        reference_length = rng.choice([None, rng.randint(1, 40), len(delays)])
        reference = None if reference_length is None else " ".join(["w"] * reference_length)
        ours = sentence_latency(delays, source_length=source_length, reference_length=reference_length)
        theirs = simuleval_scores(delays, source_length, reference)
        for name in METRICS:
            assert ours[name] == pytest.approx(theirs[name], abs=1e-9, rel=0), (name, delays, source_length,
                                                                                reference_length)


@needs_simuleval
@pytest.mark.parametrize("delays, source_length, reference_length", [
    ([5, 6, 6], 3, 3),  # delays[0] > |x|: AL and LAAL are delays[0]
    ([4], 3, None),
    ([3, 3, 3, 3], 3, 1),  # read everything first, reference shorter than the hypothesis
    ([1], 1, 7),  # reference much longer
    ([1, 1, 1, 1, 1, 1], 10, 2),  # never reads to the end: tau is |y|
    ([0, 0, 2], 2, 3),  # written before reading
    ([2.5, 3.0], 4, 2),  # non-integer delays (SimulEval takes any number)
])
def test_edge_cases_equal_simuleval(delays: list[int], source_length: int,
                                    reference_length: int | None) -> None:
    reference = None if reference_length is None else " ".join(["w"] * reference_length)
    ours = sentence_latency(delays, source_length=source_length, reference_length=reference_length)
    theirs = simuleval_scores(delays, source_length, reference)
    assert ours == pytest.approx(theirs, abs=1e-9, rel=0)


@needs_simuleval
def test_the_corpus_score_is_simulevals_mean_which_leaves_out_empty_hypotheses() -> None:
    assert latency_scorer is not None
    sentences = [([1, 2, 3], 3, "a b c"), ([], 4, "a b"), ([2, 2], 2, "a b c d"), ([1, 3, 4, 4], 4, "a")]
    ours = corpus_latency(sentence_latency(d, source_length=n, reference_length=reference_words(r))
                          for d, n, r in sentences)
    instances = {i: instance(d, n, r) for i, (d, n, r) in enumerate(sentences)}
    for name, scorer in {"ap": latency_scorer.APScorer(), "al": latency_scorer.ALScorer(),
                         "laal": latency_scorer.LAALScorer(), "dal": latency_scorer.DALScorer()}.items():
        assert ours[name] == pytest.approx(scorer(instances), abs=1e-9, rel=0)


def test_hand_computed_values() -> None:
    # wait-2 on |x| = |y| = 4, delays 2 3 4 4: tau = 3 (the first delay reaching 4), gamma = 1:
    # AL = ((2 - 0) + (3 - 1) + (4 - 2)) / 3 = 2; AP = (2 + 3 + 4 + 4) / (4 * 4) = 13/16;
    # DAL: g' = 2, max(3, 3) = 3, max(4, 4) = 4, max(4, 5) = 5, so ((2-0) + (3-1) + (4-2) + (5-3)) / 4 = 2
    s = sentence_latency([2, 3, 4, 4], source_length=4, reference_length=4)
    assert s == pytest.approx({"ap": 13 / 16, "al": 2.0, "laal": 2.0, "dal": 2.0})
    # the same delays against a reference of 2 words: AP = 13 / (4 * 2); AL: gamma = 2 / 4, so
    # ((2 - 0) + (3 - 2) + (4 - 4)) / 3 = 1; LAAL takes max(4, 2) = 4 words: 2 as above; DAL ignores it
    s = sentence_latency([2, 3, 4, 4], source_length=4, reference_length=2)
    assert s == pytest.approx({"ap": 13 / 8, "al": 1.0, "laal": 2.0, "dal": 2.0})
    # |y| = 2 |x| without a reference: gamma = 2; AL = ((1 - 0) + (1 - 0.5) + (2 - 1)) / 3;
    # DAL: g' = 1, max(1, 1.5) = 1.5, max(2, 2) = 2, max(2, 2.5) = 2.5 -> (1 + 1 + 1 + 1) / 4 = 1
    s = sentence_latency([1, 1, 2, 2], source_length=2)
    assert s == pytest.approx({"ap": 6 / 8, "al": 2.5 / 3, "laal": 2.5 / 3, "dal": 1.0})


def test_an_empty_hypothesis_or_source_has_no_latency_and_is_left_out_of_the_mean() -> None:
    assert all(math.isnan(v) for v in sentence_latency([], source_length=3, reference_length=2).values())
    assert all(math.isnan(v) for v in sentence_latency([0, 0], source_length=0).values())
    one = sentence_latency([1, 2], source_length=2)
    assert corpus_latency([one, sentence_latency([], source_length=3)]) == one
    assert all(math.isnan(v) for v in corpus_latency([]).values())
    assert reference_words("") == 1 and reference_words(" a b \n") == 2
