"""Examples as id sequences, padding, and token-based batching by length.

Sources end with EOS; targets are fed as ``BOS y`` and predicted as ``y EOS``.
Shapes: B sentences, S source length, T target length.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from seqtrans.vocab import BOS, EOS, PAD

if TYPE_CHECKING:
    from seqtrans.tasks.protocol import Codec, Example

log = logging.getLogger(__name__)


def pad_batch(seqs: Sequence[Sequence[int]], *, pad: int = PAD) -> Tensor:
    """[[ids], ...] -> [B, longest], right-padded."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return out


@dataclass
class Batch:
    src: Tensor  # [B, S]
    tgt_in: Tensor  # [B, T]: BOS y
    tgt_out: Tensor  # [B, T]: y EOS

    @property
    def target_tokens(self) -> int:
        return int(self.tgt_out.ne(PAD).sum())

    @property
    def source_tokens(self) -> int:
        return int(self.src.ne(PAD).sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True))


@dataclass
class Pairs:
    """Encoded parallel data: ``src[i]`` ends with EOS, ``tgt[i]`` has neither BOS nor EOS.
    ``kept[i]`` is the position of pair ``i`` among the examples it was encoded from
    (empty when not tracked)."""

    src: list[list[int]]
    tgt: list[list[int]]
    kept: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.src)

    def batch(self, indices: Sequence[int]) -> Batch:
        tgt = [self.tgt[i] for i in indices]
        return Batch(
            pad_batch([self.src[i] for i in indices]),
            pad_batch([[BOS, *t] for t in tgt]),
            pad_batch([[*t, EOS] for t in tgt]),
        )


def source_ids(codec: Codec[Any, Any, Any], source: Any) -> list[int]:
    """A source's ids through the task's codec, ending with EOS."""
    return codec.vocabularies.source.encode(codec.source_tokens(source)) + [EOS]


def target_ids(codec: Codec[Any, Any, Any], target: Any) -> list[int]:
    """A reference's ids through the task's codec, without BOS or EOS."""
    return codec.vocabularies.target.encode(codec.target_tokens(target))


def prediction(codec: Codec[Any, Any, Any], ids: Iterable[int], source: Any) -> Any:
    """The task's prediction from decoded target ids (up to the first EOS)."""
    return codec.prediction(codec.vocabularies.target.decode(ids), source)


def encode_pairs(codec: Codec[Any, Any, Any], examples: Iterable[Example[Any, Any]], *,
                 max_length: int | None = None, what: str = "examples") -> Pairs:
    """Map examples to ids through the task's codec.

    With ``max_length``, pairs whose source or target (with its end symbol) is longer
    are dropped, and the number dropped is logged.
    """
    src, tgt, kept = [], [], []
    dropped = 0
    for i, ex in enumerate(examples):
        s = source_ids(codec, ex.source)
        t = target_ids(codec, ex.target)
        if max_length is not None and (len(s) > max_length or len(t) + 1 > max_length):
            dropped += 1
            continue
        src.append(s)
        tgt.append(t)
        kept.append(i)
    if dropped:
        log.warning("dropped %d of %d %s longer than %d tokens (train.max_length)",
                    dropped, dropped + len(src), what, max_length)
    return Pairs(src, tgt, kept)


def token_batches(src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int, *,
                  seed: int, epoch: int, shuffle: bool = True) -> list[list[int]]:
    """Batches of about ``max_tokens`` source and ``max_tokens`` target tokens, padding included.

    Examples are sorted by length (ties in a random order) and cut into batches, so
    each batch holds similar lengths; with ``shuffle`` the batches come in a random
    order. The result depends only on the lengths, ``seed`` and ``epoch``. A single
    example longer than ``max_tokens`` forms a batch of its own.
    """
    n = len(src_lengths)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    src = np.asarray(src_lengths)
    tgt = np.asarray(tgt_lengths) + 1  # the target side is fed with BOS / predicted with EOS
    tiebreak = rng.permutation(n) if shuffle else np.arange(n)
    order = np.lexsort((tiebreak, tgt, src))
    batches: list[list[int]] = []
    start, max_s, max_t = 0, 0, 0
    for pos, i in enumerate(order.tolist()):
        ms, mt = max(max_s, src[i]), max(max_t, tgt[i])
        count = pos - start + 1
        if count > 1 and (ms * count > max_tokens or mt * count > max_tokens):
            batches.append(order[start:pos].tolist())
            start, ms, mt = pos, src[i], tgt[i]
        max_s, max_t = ms, mt
    batches.append(order[start:].tolist())
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches
