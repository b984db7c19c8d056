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

from seqtrans.data.encoding import prediction as prediction  # the id conversions, torch-free for workers
from seqtrans.data.encoding import source_ids as source_ids
from seqtrans.data.encoding import target_ids as target_ids
from seqtrans.data.encoding import within
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.errors import DataError

if TYPE_CHECKING:
    from seqtrans.config import ModelConfig
    from seqtrans.tasks.protocol import Codec, Example

log = logging.getLogger(__name__)


def too_long(config: ModelConfig, codec: Codec[Any, Any, Any], source: Any) -> str | None:
    """Why a model of ``config`` cannot read ``source`` (more tokens than its learned
    positions reach), or None when it can."""
    limit = config.position_limit
    if limit is None:
        return None
    length = len(source_ids(codec, source))
    if length <= limit:
        return None
    return (f"{length} source tokens (with the end symbol), more than the {limit} positions "
            "the model learned (model.max_positions)")


def check_sources(config: ModelConfig, codec: Codec[Any, Any, Any],
                  examples: Sequence[Example[Any, Any]]) -> None:
    """A :class:`DataError` naming the first example a model of ``config`` cannot read:
    checked before decoding starts, instead of failing in the middle of it."""
    for example in examples:
        problem = too_long(config, codec, example.source)
        if problem is not None:
            raise DataError(example.origin, None, problem)


def pad_batch(seqs: Sequence[Sequence[int]], *, pad: int = PAD, before: int | None = None,
              after: int | None = None) -> Tensor:
    """[[ids], ...] -> [B, longest (+1 for ``before``, +1 for ``after``)], right-padded; each
    row is ``before ids after`` when those symbols are given. Sequences may be lists or
    arrays (:class:`~seqtrans.prepare.binarized.MappedSequences`)."""
    lead = int(before is not None)
    width = max(len(s) for s in seqs) + lead + int(after is not None)
    out = np.full((len(seqs), width), pad, dtype=np.int64)
    if before is not None:
        out[:, 0] = before
    for i, s in enumerate(seqs):
        out[i, lead: lead + len(s)] = s
        if after is not None:
            out[i, lead + len(s)] = after
    return torch.from_numpy(out)


def lengths_of(seqs: Sequence[Sequence[int]]) -> np.ndarray:
    """The length of every sequence, as an array (mapped sequences keep theirs)."""
    known = getattr(seqs, "lengths", None)
    if known is not None:
        return np.asarray(known)
    return np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))


@dataclass
class Batch:
    src: Tensor  # [B, S]
    tgt_in: Tensor  # [B, T]: BOS y
    tgt_out: Tensor  # [B, T]: y EOS

    @property
    def target_tokens(self) -> int:
        return int(self.tgt_out.ne(PAD).sum())

    def to(self, device: torch.device) -> Batch:
        return Batch(self.src.to(device, non_blocking=True), self.tgt_in.to(device, non_blocking=True),
                     self.tgt_out.to(device, non_blocking=True))


@dataclass
class Pairs:
    """Encoded parallel data: ``src[i]`` ends with EOS, ``tgt[i]`` has neither BOS nor EOS.
    ``kept[i]`` is the position of pair ``i`` among the examples it was encoded from
    (empty when not tracked). The sides are lists in memory, or memory-mapped
    (:mod:`seqtrans.prepare.binarized`, what :mod:`seqtrans.prepare` gives for training data)."""

    src: Sequence[Any]  # of list[int] or np.ndarray
    tgt: Sequence[Any]
    kept: Sequence[int] | np.ndarray = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.src)

    def batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        tgt = [self.tgt[i] for i in indices]
        return Batch(pad_batch([self.src[i] for i in indices]), pad_batch(tgt, before=BOS),
                     pad_batch(tgt, after=EOS))


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
        if max_length is not None and not within(max_length, s, t):
            dropped += 1
            continue
        src.append(s)
        tgt.append(t)
        kept.append(i)
    if dropped:
        log.warning("dropped %d of %d %s longer than %d tokens (train.max_length)",
                    dropped, dropped + len(src), what, max_length)
    return Pairs(src, tgt, kept)


def token_batches(src_lengths: Sequence[int] | np.ndarray, tgt_lengths: Sequence[int] | np.ndarray,
                  max_tokens: int, *, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """Batches (arrays of example indices) of about ``max_tokens`` source and
    ``max_tokens`` target tokens, padding included.

    Examples are sorted by length (ties in a random order) and cut into batches, so
    each batch holds similar lengths; with ``shuffle`` the batches come in a random
    order. The result depends only on the lengths, ``seed`` and ``epoch``. A single
    example longer than ``max_tokens`` forms a batch of its own. The batches are views
    of one index array: memory grows by 8 bytes an example, not by Python objects.
    """
    n = len(src_lengths)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1  # the target side is fed with BOS / predicted with EOS
    tiebreak = rng.permutation(n) if shuffle else np.arange(n)
    order = np.lexsort((tiebreak, tgt, src))
    cuts = _cuts(src[order], tgt[order], max_tokens)
    batches = np.split(order, cuts)
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


def _cuts(src: np.ndarray, tgt: np.ndarray, max_tokens: int, chunk: int = 1 << 16) -> list[int]:
    """Where sorted examples start a new batch: greedily, when adding one would make the
    batch exceed ``max_tokens`` on either side (the longest of each side, times the
    count). ``src`` is ascending, so its longest is the newest. Read in chunks, so that
    a few million examples never become Python ints all at once."""
    cuts: list[int] = []
    start, max_t = 0, 0
    for base in range(0, len(src), chunk):
        for offset, (s, t) in enumerate(zip(src[base: base + chunk].tolist(),
                                            tgt[base: base + chunk].tolist())):
            pos = base + offset
            mt = t if t > max_t else max_t
            count = pos - start + 1
            if count > 1 and (s * count > max_tokens or mt * count > max_tokens):
                cuts.append(pos)
                start, mt = pos, t
            max_t = mt
    return cuts
