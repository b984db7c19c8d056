"""Sampled segmentations: sentencepiece's lattice and distribution, drawn reproducibly."""

from __future__ import annotations

import collections
import math
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

from parsing_data import SHARED_DATA
from seqtrans_parsing.sampling import UnigramSampler
from seqtrans_parsing.subwords import WORD_START, train_sentencepiece
from seqtrans_parsing.trees import preprocess, read_trees

DEV = SHARED_DATA / "ptb-sample" / "dev.trees"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    trees = [preprocess(t) for t, _ in read_trees(DEV.read_text())]
    sentences = [[w for _, w in t.tagged()] for t in trees if t is not None]
    path = tmp_path_factory.mktemp("sp") / "sentencepiece.model"
    train_sentencepiece([" ".join(s) for s in sentences], path, vocab_size=500, model_type="unigram")
    return path, sentences


def _processor(path: Path):  # noqa: ANN202
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path))


def _paths(sampler: UnigramSampler, text: str, begin: int = 0) -> list[list[tuple[str, float]]]:
    """Every segmentation of the lattice, by brute force."""
    if begin == len(text):
        return [[]]
    return [[(piece, score), *rest] for end, piece, score in sampler.edges(text, begin)
            for rest in _paths(sampler, text, end)]


def _best(sampler: UnigramSampler, text: str) -> list[str]:
    """The highest-scoring segmentation, by dynamic programming over the lattice."""
    best: list[tuple[float, list[str]]] = [(0.0, [])] + [(-math.inf, [])] * len(text)
    for begin in range(len(text)):
        for end, piece, score in sampler.edges(text, begin):
            if best[begin][0] + score > best[end][0]:
                best[end] = (best[begin][0] + score, [*best[begin][1], piece])
    return best[-1][1]


def test_the_lattice_is_sentencepieces(model: tuple[Path, list[list[str]]]) -> None:
    """Its best path is sentencepiece's own segmentation, unknown characters included."""
    path, sentences = model
    sp = _processor(path)
    sampler = UnigramSampler.of(sp)
    unk = sp.id_to_piece(sp.unk_id())
    for words in sentences + [["\u03a9mega", "saw", "\u00e6ther", "(", "1956", ")", "."]]:
        ours = [p for w in words for p in _best(sampler, WORD_START + w)]
        pieces = sp.encode(" ".join(words), out_type=str)
        theirs = [unk if sp.piece_to_id(p) == sp.unk_id() else p for p in pieces]
        assert ours == theirs, words


@pytest.mark.parametrize("word, alpha", [("publishing", 0.2), ("chairman", 0.1), ("Dutch", 0.5)])
def test_samples_follow_the_smoothed_distribution_of_every_segmentation(
        model: tuple[Path, list[list[str]]], word: str, alpha: float) -> None:
    sampler = UnigramSampler.of(_processor(model[0]))
    segmentations = _paths(sampler, WORD_START + word)
    weights = [math.exp(alpha * sum(score for _, score in seg)) for seg in segmentations]
    exact = {tuple(p for p, _ in seg): w / sum(weights) for seg, w in zip(segmentations, weights)}
    rng = random.Random(0)
    n = 20000
    counts = collections.Counter(tuple(sampler.sample_word(word, alpha, rng)) for _ in range(n))
    assert set(counts) <= set(exact)
    for segmentation, p in exact.items():
        assert abs(counts[segmentation] / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-3, segmentation


def test_the_same_seed_gives_the_same_samples_in_another_process(model: tuple[Path, list[list[str]]]) -> None:
    path, sentences = model
    script = ("import random, sys; import sentencepiece as spm; from seqtrans_parsing.sampling import "
              "UnigramSampler; s = UnigramSampler.of(spm.SentencePieceProcessor(model_file=sys.argv[1])); "
              "rng = random.Random(7); print([s.sample(w.split(), 0.2, rng) for w in sys.argv[2:]])")
    args = [sys.executable, "-c", script, str(path), *(" ".join(s) for s in sentences[:50])]
    first, second = (subprocess.run(args, capture_output=True, text=True, check=True).stdout
                     for _ in range(2))
    assert first == second
    sampler = pickle.loads(pickle.dumps(UnigramSampler.of(_processor(path))))
    rng = random.Random(7)
    assert first.strip() == str([sampler.sample(s, 0.2, rng) for s in sentences[:50]])
