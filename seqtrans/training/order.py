"""The order of the training data: each epoch's batches, the global batches of each
update, and the data position ``(epoch, batch in epoch)`` that a checkpoint saves.

An epoch's batches depend only on the lengths, the seed and the epoch (and on the
task's resampled sources, which depend only on the epoch), so a resumed run rebuilds
them and continues from the saved position. Under data parallelism every rank builds
the same global batches; an update takes the next ``ranks * accumulate`` of them and
:func:`seqtrans.training.distributed.deal` hands each rank its share."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from seqtrans.data.batches import Pairs, lengths_of, token_batches
from seqtrans.training.progress import Progress

#: ``resample(epoch)``: the training sources of that epoch (ids ending with EOS), one per pair.
Resample = Callable[[int], list[list[int]]]


class EpochBatches:
    """The batches of each epoch of ``pairs`` (index arrays), about ``max_tokens`` each.

    With ``resample``, each epoch trains on the sources it returns for that epoch;
    :attr:`pairs` then holds the sources of the epoch asked for last."""

    def __init__(self, pairs: Pairs, *, max_tokens: int, seed: int, resample: Resample | None = None) -> None:
        self.pairs = pairs
        self.max_tokens = max_tokens
        self.seed = seed
        self.resample = resample
        self._src_lengths = lengths_of(pairs.src)
        self._tgt_lengths = lengths_of(pairs.tgt)

    def __call__(self, epoch: int) -> list[np.ndarray]:
        if self.resample is not None:
            src = self.resample(epoch)
            if len(src) != len(self.pairs.src):
                raise ValueError(f"resample({epoch}) gave {len(src)} sources for "
                                 f"{len(self.pairs.src)} pairs")
            self.pairs = Pairs(src, self.pairs.tgt, self.pairs.kept)
            self._src_lengths = lengths_of(src)
        return token_batches(self._src_lengths, self._tgt_lengths, self.max_tokens,
                             seed=self.seed, epoch=epoch)

    def target_tokens(self, indices: np.ndarray) -> int:
        """Target tokens of a batch (EOS included), from the lengths alone."""
        return int(np.asarray(self._tgt_lengths)[indices].sum()) + len(indices)


def update_groups(batches_of: Callable[[int], list[np.ndarray]], progress: Progress, *,
                  per_update: int, max_epochs: int = 0) -> Iterator[list[np.ndarray]]:
    """The global batches of each update, ``per_update`` of them, from the data position
    of ``progress`` on, which they advance. An update may span two epochs; at the end of
    epoch ``max_epochs`` (0: no limit) the last update takes what is left and
    ``progress.stop_reason`` says why the groups ended."""
    epoch_batches = batches_of(progress.epoch)
    while True:
        group: list[np.ndarray] = []
        while len(group) < per_update:
            if progress.batch_in_epoch >= len(epoch_batches):
                if max_epochs and progress.epoch >= max_epochs:
                    progress.stop_reason = f"reached {max_epochs} epochs"
                    if group:
                        yield group
                    return
                progress.epoch += 1
                progress.batch_in_epoch = 0
                epoch_batches = batches_of(progress.epoch)
            group.append(epoch_batches[progress.batch_in_epoch])
            progress.batch_in_epoch += 1
        yield group
