"""Segmentations sampled from a sentencepiece unigram model, reproducibly.

Subword regularization (Kudo 2018) samples a segmentation x of each word with
probability proportional to P(x)^alpha, P(x) the product of the unigram model's piece
probabilities. sentencepiece samples from a generator it seeds once per thread, so the
same seed gives different samples in different processes; a resumed or repeated run
would train on other data. This module samples the same distribution with a generator
the caller seeds: forward filtering over each word's lattice of pieces, then backward
sampling (the algorithm sentencepiece uses with ``nbest_size=-1``).

The lattice is sentencepiece's: every piece of the model that matches the text at a
position (pieces never span white space, so each word, ``▁`` included, is a lattice of
its own), and, where no one-character piece matches, the unknown symbol for that
character with the model's unknown score (the lowest piece score minus 10). The forward
scores of a word depend only on the word and alpha, so they are computed once per word
type; a sample then costs a few draws per word.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from typing import Any

from seqtrans_parsing.subwords import WORD_START

__all__ = ["UnigramSampler"]

UNK_PENALTY = 10.0  # sentencepiece's kUnkPenalty

# per position: the edges entering it (their start positions and pieces) and their
# cumulative sampling weights
_Lattice = tuple[tuple[tuple[int, ...], tuple[str, ...], list[float]], ...]


class UnigramSampler:
    """Samples segmentations of words with a unigram model's pieces and scores."""

    def __init__(self, scores: dict[str, float], *, unk: str, unk_score: float) -> None:
        self.scores = scores
        self.unk = unk
        self.unk_score = unk_score
        self.longest = max(len(p) for p in scores)
        self._lattices: dict[tuple[str, float], _Lattice] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lattices": {}}  # a cache: rebuilt where it is needed

    @classmethod
    def of(cls, processor: Any) -> UnigramSampler:
        """The sampler of a loaded ``sentencepiece.SentencePieceProcessor`` (a unigram model)."""
        scores = {}
        for i in range(processor.get_piece_size()):
            if not (processor.is_unknown(i) or processor.is_control(i) or processor.is_unused(i)):
                scores[processor.id_to_piece(i)] = processor.get_score(i)
        return cls(scores, unk=processor.id_to_piece(processor.unk_id()),
                   unk_score=min(scores.values()) - UNK_PENALTY)

    def edges(self, text: str, start: int) -> list[tuple[int, str, float]]:
        """The lattice's edges leaving ``start``: (end, piece, score)."""
        out = []
        single = False
        for end in range(start + 1, min(len(text), start + self.longest) + 1):
            piece = text[start:end]
            score = self.scores.get(piece)
            if score is not None:
                out.append((end, piece, score))
                single = single or end == start + 1
        if not single:
            out.append((start + 1, self.unk, self.unk_score))
        return out

    def _lattice(self, text: str, alpha: float) -> _Lattice:
        key = (text, alpha)
        if key not in self._lattices:
            self._lattices[key] = self._backward_choices(text, alpha)
        return self._lattices[key]

    def _backward_choices(self, text: str, alpha: float) -> _Lattice:
        """Forward filtering: for each position, the edges entering it, with cumulative
        weights proportional to the summed weight of all paths that end with that edge."""
        n = len(text)
        entering: list[list[tuple[int, str, float]]] = [[] for _ in range(n + 1)]
        for begin in range(n):
            for end, piece, score in self.edges(text, begin):
                entering[end].append((begin, piece, alpha * score))
        forward = [0.0] + [-math.inf] * n  # log of the summed weight of the paths to each position
        choices: list[tuple[tuple[int, ...], tuple[str, ...], list[float]]] = [((), (), [])]
        for end in range(1, n + 1):
            options = [(b, piece, forward[b] + s) for b, piece, s in entering[end] if forward[b] > -math.inf]
            top = max(w for _, _, w in options)
            weights = [math.exp(w - top) for _, _, w in options]
            forward[end] = top + math.log(sum(weights))
            choices.append((tuple(b for b, _, _ in options), tuple(p for _, p, _ in options),
                            list(itertools.accumulate(weights))))
        return tuple(choices)

    def sample_word(self, word: str, alpha: float, rng: random.Random) -> list[str]:
        """One segmentation of ``▁word``, drawn backwards from its end."""
        text = WORD_START + word
        choices = self._lattice(text, alpha)
        pieces: list[str] = []
        end = len(text)
        while end > 0:
            begins, options, cumulative = choices[end]
            i = bisect.bisect_right(cumulative, rng.random() * cumulative[-1])
            i = min(i, len(options) - 1)
            pieces.append(options[i])
            end = begins[i]
        return pieces[::-1]

    def sample(self, words: Sequence[str], alpha: float, rng: random.Random) -> list[str]:
        """The pieces of a sentence, each word's segmentation drawn independently."""
        return [piece for word in words for piece in self.sample_word(word, alpha, rng)]

