"""Token-based batching and encoding of examples."""

from __future__ import annotations

import logging
import random

import numpy as np

from fake_plugins.lines_task import LinesCodec
from seqtrans.data.batches import encode_pairs, pad_batch, token_batches
from seqtrans.data.vocab import BOS, EOS, PAD, Vocab, Vocabularies
from seqtrans.tasks import Example


def lengths(n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randint(1, 50) for _ in range(n)], [rng.randint(1, 60) for _ in range(n)]


def test_batches_hold_every_example_once_within_the_token_budget() -> None:
    src, tgt = lengths(500)
    batches = token_batches(src, tgt, 400, seed=1, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(src[i] for i in b) <= 400
        assert len(b) * (max(tgt[i] for i in b) + 1) <= 400
    # similar lengths share a batch: padding stays small
    padded = sum(len(b) * max(src[i] for i in b) for b in batches)
    assert padded < 1.15 * sum(src)


def as_lists(batches: list[np.ndarray]) -> list[list[int]]:
    return [b.tolist() for b in batches]


def test_batches_are_deterministic_per_seed_and_shuffled_per_epoch() -> None:
    src, tgt = lengths(300)
    a = as_lists(token_batches(src, tgt, 300, seed=1, epoch=1))
    assert a == as_lists(token_batches(src, tgt, 300, seed=1, epoch=1))
    assert a != as_lists(token_batches(src, tgt, 300, seed=1, epoch=2))
    assert a != as_lists(token_batches(src, tgt, 300, seed=2, epoch=1))


def test_an_example_longer_than_the_budget_gets_its_own_batch() -> None:
    batches = as_lists(token_batches([3, 100, 4], [3, 5, 4], 50, seed=0, epoch=0, shuffle=False))
    assert [1] in batches and sorted(i for b in batches for i in b) == [0, 1, 2]


def reference_cuts(order: list[int], src: list[int], tgt: list[int], max_tokens: int) -> list[list[int]]:
    """The greedy cut written plainly: add examples in order while both sides' longest
    (target + 1) times the count stays within the budget."""
    batches: list[list[int]] = [[]]
    for i in order:
        trial = batches[-1] + [i]
        fits = (len(trial) * max(src[j] for j in trial) <= max_tokens
                and len(trial) * max(tgt[j] + 1 for j in trial) <= max_tokens)
        if fits or len(trial) == 1:
            batches[-1] = trial
        else:
            batches.append([i])
    return batches


def test_batches_match_a_plain_greedy_cut_across_chunks(monkeypatch) -> None:
    from seqtrans.data import batches as data

    src, tgt = lengths(3000, seed=3)
    original = data._cuts
    monkeypatch.setattr(data, "_cuts", lambda s, t, m: original(s, t, m, chunk=7))  # many chunk edges
    got = as_lists(token_batches(src, tgt, 500, seed=0, epoch=0, shuffle=False))
    order = sorted(range(len(src)), key=lambda i: (src[i], tgt[i], i))
    assert got == reference_cuts(order, src, tgt, 500)


def test_pad_batch_and_target_shift() -> None:
    assert pad_batch([[5, 6], [7]]).tolist() == [[5, 6], [7, PAD]]


def test_encode_pairs_drops_and_counts_overlong_pairs(caplog) -> None:
    vocab = Vocab(["a", "b"])
    examples = [Example("a b", "b a"), Example("a a a a a", "a"), Example("b", "a b b b b")]
    with caplog.at_level(logging.WARNING):
        pairs = encode_pairs(LinesCodec(Vocabularies(vocab, vocab)), examples, max_length=4, what="pairs")
    assert pairs.src == [[4, 5, EOS]] and pairs.tgt == [[5, 4]]
    assert "dropped 2 of 3 pairs" in caplog.text
    batch = pairs.batch([0])
    assert batch.tgt_in.tolist() == [[BOS, 5, 4]] and batch.tgt_out.tolist() == [[5, 4, EOS]]
