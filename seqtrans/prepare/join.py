"""Joining a preparation's shards into the dataset's files (:mod:`seqtrans.prepare.binarized`):
one ids file per side with offsets and lengths, the examples' positions, duplicate
pairs removed when asked (``train.dedup``), and ``meta.json`` written last."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqtrans.config import RunConfig
from seqtrans.errors import DataError
from seqtrans.prepare.binarized import (
    FORMAT,
    META,
    SIDES,
    IdsWriter,
    PreparedError,
    ids_dtype,
    lengths_dtype,
    save_array,
)
from seqtrans.prepare.vocabulary import COUNT
from seqtrans.prepare.workers import Removed
from seqtrans.runtime import atomic
from seqtrans.tasks.protocol import Codec

log = logging.getLogger(__name__)


def join(codec: Codec[Any, Any, Any], config: RunConfig, key: str, partial: Path, shards: Path,
         removed: Removed, examples: int, *, expected: int) -> None:
    """Join the ``expected`` shards of ``examples`` examples into the dataset's files;
    ``meta.json`` last."""
    paths = sorted(shards.glob("shard-*.npz"))
    if len(paths) != expected:
        raise PreparedError(shards, None, f"{len(paths)} shards for {examples} examples, expected {expected}")
    inputs = examples + sum(removed.counts.values())  # before the engine's own removals
    keep = _kept(paths, dedup=config.train.dedup, removed=removed)
    vocabs = codec.vocabularies
    dtype = ids_dtype(max(len(vocabs.source), len(vocabs.target)))
    writers = {side: IdsWriter(partial / f"{side}.ids", dtype=dtype, key=key) for side in SIDES}
    too_long, lengths, positions = _copy_shards(paths, keep, writers)
    if too_long:
        removed.counts[f"longer than train.max_length={config.train.max_length} tokens"] = too_long
    for reason, count in removed.counts.items():
        if reason not in removed.first:  # the engine's own removals; the task's were logged as read
            log.warning("train: removed %d of %d pairs: %s", count, examples, reason)
    files: dict[str, dict[str, Any]] = {}
    tokens = {}
    for side in SIDES:
        files[f"{side}.ids"] = {"sha256": writers[side].close()}
        tokens[side] = _write_lengths(partial, side, lengths[side], files)
    pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    files["positions.npy"] = {"sha256": save_array(partial / "positions.npy", pos.astype(np.int64))}
    for name, info in files.items():
        info["bytes"] = (partial / name).stat().st_size
    shutil.rmtree(shards)
    (partial / COUNT).unlink(missing_ok=True)
    if not len(pos):
        raise DataError(None, None, f"no training pairs are left after preparation (removed: "
                                    f"{dict(removed.counts) or 'none'})")
    meta = {
        "format": FORMAT, "key": key, "task": config.task, "pairs": len(pos), "inputs_read": inputs,
        "tokens": {"source": tokens["src"], "target": tokens["tgt"]},
        "removed": dict(sorted(removed.counts.items())), "ids_dtype": dtype.str,
        "vocabulary": {"source": len(vocabs.source), "target": len(vocabs.target), "shared": vocabs.shared},
        "settings": {"max_length": config.train.max_length, "dedup": config.train.dedup},
        "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    atomic.write_json(partial / META, meta)
    log.info("prepared data: %d pairs (%d source / %d target tokens) of %d inputs read; removed: %s",
             len(pos), tokens["src"], tokens["tgt"], inputs,
             ", ".join(f"{n} {reason}" for reason, n in sorted(removed.counts.items())) or "none")


def _kept(paths: list[Path], *, dedup: bool, removed: Removed) -> np.ndarray:
    """Which pairs of the shards are kept, in order [P] bool: all, or with ``dedup`` the
    first of each pair hash (the repeats counted in ``removed``)."""
    hashes = np.concatenate([np.load(p)["hashes"] for p in paths]) if paths else np.zeros(0, np.uint64)
    keep = np.ones(len(hashes), dtype=bool)
    if dedup and len(hashes):
        _, first = np.unique(hashes, return_index=True)
        keep[:] = False
        keep[first] = True
        removed.counts["duplicate of an earlier pair (train.dedup)"] = int((~keep).sum())
    return keep


def _copy_shards(paths: list[Path], keep: np.ndarray, writers: Mapping[str, IdsWriter],
                 ) -> tuple[int, dict[str, list[np.ndarray]], list[np.ndarray]]:
    """Append the kept pairs' ids of every shard to ``writers``; the count of pairs too long
    for ``train.max_length``, the kept lengths of each side and the kept positions, per shard."""
    too_long = 0
    lengths: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    positions: list[np.ndarray] = []
    start = 0
    for path in paths:
        shard = np.load(path)
        too_long += int(shard["too_long"])
        mask = keep[start: start + len(shard["hashes"])]
        start += len(mask)
        for side in SIDES:
            ids, lens = shard[side], shard[f"{side}_len"]
            if not mask.all():
                ends = np.cumsum(lens)
                ids = np.concatenate([ids[a:b] for a, b, k in zip(ends - lens, ends, mask) if k] or [ids[:0]])
                lens = lens[mask]
            writers[side].append(ids)
            lengths[side].append(lens)
        positions.append(shard["positions"][mask])
    return too_long, lengths, positions


def _write_lengths(partial: Path, side: str, lengths: list[np.ndarray],
                   files: dict[str, dict[str, Any]]) -> int:
    """Write a side's offsets and lengths (recorded in ``files``); its number of tokens."""
    lens = np.concatenate(lengths) if lengths else np.zeros(0, np.int32)
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    files[f"{side}.offsets.npy"] = {"sha256": save_array(partial / f"{side}.offsets.npy", offsets)}
    narrow = lens.astype(lengths_dtype(int(lens.max(initial=0))))
    files[f"{side}.lengths.npy"] = {"sha256": save_array(partial / f"{side}.lengths.npy", narrow)}
    return int(offsets[-1])
