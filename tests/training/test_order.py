"""The data order: each epoch's batches, the update groups, and resuming from a data
position, against hand-written epochs and an uninterrupted sequential reference."""

from __future__ import annotations

import numpy as np
import pytest

from seqtrans.data.batches import Pairs, token_batches
from seqtrans.training.order import EpochBatches, update_groups
from seqtrans.training.progress import Progress


def epochs_of(*sizes: int) -> dict[int, list[np.ndarray]]:
    """Epochs of ``sizes`` batches whose single index names them: 100 * epoch + batch."""
    return {e: [np.array([100 * e + b]) for b in range(n)] for e, n in enumerate(sizes, start=1)}


def names(groups: list[list[np.ndarray]]) -> list[list[int]]:
    return [[int(b[0]) for b in group] for group in groups]


def test_groups_take_the_next_batches_across_epoch_boundaries() -> None:
    epochs = epochs_of(4, 2, 3)
    progress = Progress()
    groups = update_groups(epochs.__getitem__, progress, per_update=3)
    assert names([next(groups) for _ in range(3)]) == [[100, 101, 102], [103, 200, 201], [300, 301, 302]]
    assert (progress.epoch, progress.batch_in_epoch) == (3, 3)


def test_the_last_epoch_ends_with_what_is_left_and_says_why() -> None:
    progress = Progress()
    groups = list(update_groups(epochs_of(4, 3).__getitem__, progress, per_update=2, max_epochs=2))
    assert names(groups) == [[100, 101], [102, 103], [200, 201], [202]]
    assert progress.stop_reason == "reached 2 epochs"
    exact = Progress()
    assert names(list(update_groups(epochs_of(2, 2).__getitem__, exact, per_update=2, max_epochs=2))) == \
        [[100, 101], [200, 201]]  # no empty group at the end


@pytest.mark.parametrize("after", [1, 2, 3, 5])
def test_resuming_from_a_saved_position_continues_the_same_sequence(after: int) -> None:
    epochs = epochs_of(3, 5, 2, 4)
    reference = names(list(update_groups(epochs.__getitem__, Progress(), per_update=2, max_epochs=4)))
    first = Progress()
    groups = update_groups(epochs.__getitem__, first, per_update=2, max_epochs=4)
    done = names([next(groups) for _ in range(after)])
    saved = Progress(epoch=first.epoch, batch_in_epoch=first.batch_in_epoch)  # what a checkpoint keeps
    rest = names(list(update_groups(epochs.__getitem__, saved, per_update=2, max_epochs=4)))
    assert done + rest == reference


def test_epoch_batches_follow_the_lengths_seed_and_epoch() -> None:
    pairs = Pairs([[5] * n + [2] for n in range(1, 9)], [[6] * (9 - n) for n in range(1, 9)])
    epochs = EpochBatches(pairs, max_tokens=16, seed=7)
    src = [n + 1 for n in range(1, 9)]
    tgt = [9 - n for n in range(1, 9)]
    for epoch in (1, 2):
        expected = token_batches(src, tgt, 16, seed=7, epoch=epoch)
        assert [b.tolist() for b in epochs(epoch)] == [b.tolist() for b in expected]
    # target tokens with EOS: pairs 0 and 3 hold 8 and 5 target symbols
    assert epochs.target_tokens(np.array([0, 3])) == (8 + 1) + (5 + 1)


def test_resampled_sources_replace_the_pairs_of_their_epoch() -> None:
    pairs = Pairs([[4, 2], [5, 5, 2]], [[4], [5, 5]], kept=[3, 9])
    seen: list[int] = []

    def resample(epoch: int) -> list[list[int]]:
        seen.append(epoch)
        return [[4] * epoch + [2], [5, 2]]

    epochs = EpochBatches(pairs, max_tokens=64, seed=0, resample=resample)
    epochs(3)
    assert seen == [3]
    assert epochs.pairs.src == [[4, 4, 4, 2], [5, 2]]
    assert epochs.pairs.tgt == pairs.tgt and list(epochs.pairs.kept) == [3, 9]
    assert epochs.target_tokens(np.array([0, 1])) == 2 + 3  # targets are never resampled


def test_a_resample_of_another_size_is_refused() -> None:
    epochs = EpochBatches(Pairs([[4, 2]], [[4]]), max_tokens=64, seed=0, resample=lambda e: [])
    with pytest.raises(ValueError, match=r"resample\(1\) gave 0 sources for 1 pairs"):
        epochs(1)
