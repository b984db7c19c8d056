"""Vocabulary shortlists: the likely target tokens of each source token, for decoding
with the output projection restricted to them (``decode.shortlist``).

A shortlist is built from a run's training pairs (ids, as training reads them): the
``top`` target tokens of each source token by IBM Model 1's translation probability
``t(target | source)``, estimated by ``iterations`` rounds of expectation-maximisation
over the pairs (Brown et al. 1993; without the empty word: the ``frequent`` most common
target tokens, always allowed, take the part of the words it would explain), plus those
``frequent`` tokens. Marian's and Bergamot's lexical shortlists and CTranslate2's
vocabulary map are the same idea, built from fast_align's lexical tables.

It is stored in the run directory as ``shortlist.npz`` with the sha256 of the vocabulary
files it was built for; loading it for a model of other vocabulary files is an error
naming both digests. This module imports no torch.

Shapes: P pairs, V_s / V_t source / target vocabulary, N candidates per source token,
C co-occurrences (source position, target position) of a chunk of pairs.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqtrans.config import option
from seqtrans.data.vocab import EOS, PAD, SPECIALS, UNK
from seqtrans.errors import CheckpointError, UsageError
from seqtrans.runtime import atomic

log = logging.getLogger(__name__)

#: The file of a run directory that holds its shortlist.
FILE = "shortlist.npz"
FORMAT = 1
_CHUNK = 4096  # pairs whose co-occurrences are held at once


@dataclass(frozen=True)
class ShortlistSettings:
    """How a shortlist is built (``seqtrans shortlist``, and ``run`` with ``decode.shortlist``)."""

    top: int = option(50, "Candidates kept per source token: its N most probable target tokens under "
                          "IBM Model 1 (Marian's and Bergamot's shortlists keep 50 to 100).")
    frequent: int = option(100, "The M most frequent target tokens of the training data, allowed in "
                                "every output besides the candidates of its source's tokens.")
    iterations: int = option(5, "Rounds of expectation-maximisation of IBM Model 1's translation table.")

    def __post_init__(self) -> None:
        for key in ("top", "frequent", "iterations"):
            least = int(key == "iterations")
            if getattr(self, key) < least:
                raise UsageError(f"--{key}: must be at least {least}, got {getattr(self, key)}")


@dataclass(frozen=True)
class Shortlist:
    """The candidates [V_s, N] (target ids, -1 where a source token has fewer) of every
    source token, the ``frequent`` target ids [M] always allowed, the target vocabulary's
    size and the digest of the vocabulary files it was built for."""

    candidates: np.ndarray  # [V_s, N] int32
    frequent: np.ndarray  # [M] int32
    target_size: int
    vocabulary: str  # sha256 of the vocabulary files (seqtrans.data.assets.assets_digest)
    settings: ShortlistSettings

    def allowed(self, sources: Sequence[Sequence[int]]) -> np.ndarray:
        """[B, V_t] bool: the target tokens each source may produce: its tokens' candidates,
        the frequent tokens, the end symbol and the unknown symbol. The padding of a
        source changes nothing."""
        out = np.zeros((len(sources), self.target_size), dtype=bool)
        out[:, self.frequent] = True
        out[:, EOS] = True
        out[:, UNK] = True
        for b, source in enumerate(sources):
            ids = np.asarray(source, dtype=np.int64)
            ids = ids[(ids > PAD) & (ids < len(self.candidates))]  # padding has no candidates
            found = self.candidates[ids].ravel()
            out[b, found[found >= 0]] = True
        return out

    def save(self, path: str | Path) -> Path:
        """Write the shortlist to ``path`` (an ``.npz`` file), whole or not at all."""
        meta = {"format": FORMAT, "vocabulary": self.vocabulary, "target_size": self.target_size,
                "settings": asdict(self.settings)}
        buffer = io.BytesIO()
        np.savez(buffer, candidates=self.candidates, frequent=self.frequent, meta=np.array(json.dumps(meta)))
        return atomic.write_bytes(path, buffer.getvalue())


def load(path: str | Path, *, vocabulary: str) -> Shortlist:
    """The shortlist in ``path``, checked against the digest ``vocabulary`` of the model's
    vocabulary files: a :class:`CheckpointError` naming the file and both digests when it
    was built for others, or when the file is missing or unreadable."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            candidates, frequent = data["candidates"].astype(np.int64), data["frequent"].astype(np.int64)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no shortlist; build it with 'seqtrans shortlist RUN_DIR'") from None
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise CheckpointError(f"{path}: not a readable shortlist ({exc})") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: shortlist format {meta.get('format')!r}, expected {FORMAT}")
    if meta["vocabulary"] != vocabulary:
        raise CheckpointError(
            f"{path}: this shortlist was built for the vocabulary files with sha256 "
            f"{meta['vocabulary'][:12]}, but the model's have sha256 {vocabulary[:12]}; build it again "
            "with 'seqtrans shortlist RUN_DIR'")
    size = int(meta["target_size"])
    if candidates.size and (candidates.min() < -1 or candidates.max() >= size):
        raise CheckpointError(f"{path}: candidate ids outside the target vocabulary of {size}")
    return Shortlist(candidates, frequent, size, meta["vocabulary"], ShortlistSettings(**meta["settings"]))


# ----------------------------------------------------------------------------- building


def build(src: Sequence[Any], tgt: Sequence[Any], *, source_size: int, target_size: int, vocabulary: str,
          settings: ShortlistSettings | None = None) -> Shortlist:
    """The shortlist of training pairs: ``src[i]`` and ``tgt[i]`` the ids of pair i (as
    :class:`~seqtrans.data.batches.Pairs` holds them; special symbols are left out of the counts)."""
    settings = settings or ShortlistSettings()
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
    codes = _pair_codes(src, tgt, target_size)  # [U] sorted: source * V_t + target
    prob = np.ones(len(codes))  # any constant: the first round's posteriors are uniform per target token
    for _ in range(settings.iterations):
        counts = np.zeros(len(codes))
        for s, t, target_pos in _cooccurrences(src, tgt):
            u = np.searchsorted(codes, s * target_size + t)  # [C]
            weight = prob[u]
            norm = np.bincount(target_pos, weight)  # [T] each target token's sum over its sources
            counts += np.bincount(u, weight / norm[target_pos], minlength=len(codes))
        totals = np.bincount(codes // target_size, counts, minlength=source_size)  # [V_s]
        prob = counts / totals[codes // target_size]
    candidates = _best(codes, prob, source_size=source_size, target_size=target_size, top=settings.top)
    frequent = _most_frequent(tgt, target_size, settings.frequent)
    log.info("shortlist: %d source tokens with candidates, %d frequent target tokens, from %d pairs",
             int((candidates >= 0).any(axis=1).sum()), len(frequent), len(src))
    return Shortlist(candidates, frequent, target_size, vocabulary, settings)


def _content(ids: Any) -> np.ndarray:
    """The ids of one side without special symbols."""
    a = np.asarray(ids, dtype=np.int64)
    return a[a >= len(SPECIALS)]


def _cooccurrences(src: Sequence[Any], tgt: Sequence[Any],
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per chunk of pairs, every (source token, target token) of a pair: source ids [C],
    target ids [C], and the target token's index among the chunk's target tokens [C]."""
    for start in range(0, len(src), _CHUNK):
        s_parts = [_content(x) for x in src[start:start + _CHUNK]]
        t_parts = [_content(x) for x in tgt[start:start + _CHUNK]]
        ls = np.array([len(x) for x in s_parts], dtype=np.int64)
        lt = np.array([len(x) for x in t_parts], dtype=np.int64)
        if not (ls * lt).any():
            continue
        s_flat, t_flat = np.concatenate(s_parts), np.concatenate(t_parts)
        s_off, t_off = np.cumsum(ls) - ls, np.cumsum(lt) - lt  # [B]
        counts = ls * lt
        pair = np.repeat(np.arange(len(ls)), counts)  # [C] the pair of each co-occurrence
        local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)  # [C]
        target_pos = t_off[pair] + local % lt[pair]
        yield s_flat[s_off[pair] + local // lt[pair]], t_flat[target_pos], target_pos


def _pair_codes(src: Sequence[Any], tgt: Sequence[Any], target_size: int) -> np.ndarray:
    """The distinct (source, target) pairs that co-occur, as sorted codes source * V_t + target."""
    codes = np.zeros(0, dtype=np.int64)
    for s, t, _ in _cooccurrences(src, tgt):
        codes = np.union1d(codes, np.unique(s * target_size + t))
    return codes


def _best(codes: np.ndarray, prob: np.ndarray, *, source_size: int, target_size: int, top: int) -> np.ndarray:
    """[V_s, top]: each source token's ``top`` most probable targets (ties by id), -1 after them."""
    out = np.full((source_size, top), -1, dtype=np.int32)
    if not len(codes) or not top:
        return out
    source, target = codes // target_size, codes % target_size
    order = np.lexsort((target, -prob, source))  # by source, then probability, then id
    source, target = source[order], target[order]
    first = np.searchsorted(source, source)  # the first index of each one's source group
    rank = np.arange(len(source)) - first
    keep = rank < top
    out[source[keep], rank[keep]] = target[keep]
    return out


def _most_frequent(tgt: Sequence[Any], target_size: int, m: int) -> np.ndarray:
    """The ``m`` most frequent target ids (ties by id)."""
    counts = np.zeros(target_size, dtype=np.int64)
    for start in range(0, len(tgt), _CHUNK):
        parts = [_content(x) for x in tgt[start:start + _CHUNK]]
        if parts:
            counts += np.bincount(np.concatenate(parts), minlength=target_size)
    order = np.lexsort((np.arange(target_size), -counts))
    return np.sort(order[counts[order] > 0][:m]).astype(np.int32)
