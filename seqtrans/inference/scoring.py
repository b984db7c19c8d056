"""Scoring given pairs: the log-probability a model, or an ensemble, gives each target.

For reranking and filtering (fairseq's ``--score-reference``, ``marian-scorer``,
``sockeye-score``): ``log P(y EOS | x)`` by teacher forcing, the sum of what beam search
would add up along ``y`` (the same log-softmax over the whole vocabulary, the same
ensemble combination), so a hypothesis scores here what the search reported for it.

Shapes: B pairs, S source length, T target length (with BOS in, with EOS out), V vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.attention import reading
from seqtrans.config import RunConfig
from seqtrans.data.batches import pad_batch, source_ids, target_ids, too_long
from seqtrans.data.encoding import forced_prefix
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.generate import length_batches
from seqtrans.decoding.search import length_penalty
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.inputs import check_texts
from seqtrans.linear.precision import autocast
from seqtrans.model.transformer import Transformer
from seqtrans.runtime.heartbeat import Counter
from seqtrans.tasks.protocol import Codec, TargetParsing, Task

log = logging.getLogger(__name__)


class Loaded(Protocol):
    """What scoring reads of a loaded model or ensemble
    (:class:`seqtrans.inference.loaded.Loaded`), declared here so that the loaded model's
    own ``score`` can call this module."""

    config: RunConfig
    task: Task[Any, Any, Any]
    codec: Codec[Any, Any, Any]
    device: torch.device

    @property
    def models(self) -> list[Transformer]: ...

    @property
    def searcher(self) -> Transformer | Ensemble: ...


@dataclass(frozen=True)
class PairScore:
    """The log-probability of one target given its source."""

    log_prob: float  # log P(y EOS | x)
    tokens: int  # target tokens, the end symbol included

    @property
    def per_token(self) -> float:
        return self.log_prob / self.tokens

    def normalized(self, alpha: float, *, kind: str = "gnmt") -> float:
        """The score beam search ranks by: log_prob / lp(|y| + 1) (GNMT's length penalty, or
        ``kind`` as decode.length_penalty names it)."""
        return float(self.log_prob / length_penalty(float(self.tokens), alpha, kind=kind))


@torch.inference_mode()
def score_ids(model: Transformer | Ensemble, sources: Sequence[list[int]], targets: Sequence[list[int]], *,
              batch_tokens: int, device: torch.device, precision: str = "fp32",
              progress: bool = False, given: int = 0) -> list[PairScore]:
    """The score of every pair (source ids ending in EOS, target ids without BOS or EOS),
    in input order; pairs are batched by similar length, at most ``batch_tokens`` padded
    tokens a side. The first ``given`` tokens of every target count 0, as decoding reads
    them (a family's forced first token: :func:`seqtrans.decoding.beam.beam_search`)."""
    results: list[PairScore | None] = [None] * len(sources)
    for idx, picked in _teacher_forced(model, sources, targets, batch_tokens=batch_tokens, device=device,
                                       precision=precision, progress=progress, given=given):
        for i, total in zip(idx, picked.sum(dim=1).tolist()):
            results[i] = PairScore(total, len(targets[i]) + 1)
    return [r for r in results if r is not None]


@torch.inference_mode()
def token_log_probs(model: Transformer | Ensemble, sources: Sequence[list[int]], targets: Sequence[list[int]],
                    *, batch_tokens: int, device: torch.device, precision: str = "fp32",
                    given: int = 0) -> list[list[float]]:
    """The log-probability of each target token and of the end symbol, given the source
    and the tokens before it, by teacher forcing (0 for the first ``given``); in input
    order, batched as :func:`score_ids` (whose totals are their sums)."""
    results: list[list[float]] = [[] for _ in sources]
    for idx, picked in _teacher_forced(model, sources, targets, batch_tokens=batch_tokens, device=device,
                                       precision=precision, progress=False, given=given):
        for i, row in zip(idx, picked.tolist()):
            results[i] = row[: len(targets[i]) + 1]
    return results


def _teacher_forced(model: Transformer | Ensemble, sources: Sequence[list[int]], targets: Sequence[list[int]],
                    *, batch_tokens: int, device: torch.device, precision: str,
                    progress: bool, given: int = 0) -> Iterator[tuple[list[int], Tensor]]:
    """Batches of pairs by similar length: their indices and the log-probability of each
    target token and the end symbol [B, T], 0 at padding and at the first ``given``."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources and {len(targets)} targets")
    model.eval()
    lengths = [max(len(s), len(t) + 1) for s, t in zip(sources, targets)]
    bar = Counter(total=len(sources), desc="score", unit="pairs", progress=progress, logger=log)
    for idx in length_batches(lengths, batch_tokens):
        src = pad_batch([sources[i] for i in idx]).to(device)  # [B, S]
        tgt = [targets[i] for i in idx]
        tgt_in = pad_batch(tgt, before=BOS).to(device)  # [B, T]
        tgt_out = pad_batch(tgt, after=EOS).to(device)  # [B, T]
        with autocast(device, precision):
            logits = model(src, tgt_in)  # [B, T, V]
        log_probs = F.log_softmax(logits.float(), dim=-1)
        picked = log_probs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1)  # [B, T, 1] -> [B, T]
        picked[:, :given] = 0.0
        yield idx, picked.masked_fill(tgt_out.eq(PAD), 0.0)
        bar.update(len(idx))
    bar.close()


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without line ends (a byte-order mark ignored);
    invalid UTF-8 is a :class:`DataError` naming the line."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    lines = raw.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for number, line in enumerate(lines, 1):
        try:
            out.append(line.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as exc:
            raise DataError(path, number, f"invalid UTF-8 at byte {exc.start + 1} of the line") from None
    return out


def read_pairs(loaded: Loaded, src_path: str | Path,
               tgt_path: str | Path) -> tuple[list[list[int]], list[list[int]]]:
    """The ids of the line pairs of two files, through the task's codec. Files of
    different lengths, an empty line, a target the task cannot read, or a pair longer
    than a model's learned positions are a :class:`DataError` naming file and line."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        shorter, longer = sorted([(len(src_lines), str(src_path)), (len(tgt_lines), str(tgt_path))])
        raise DataError(longer[1], shorter[0] + 1, f"{longer[1]} has {longer[0]} lines, {shorter[1]} has "
                        f"{shorter[0]}: every source line needs its target line")
    paths = (src_path, tgt_path)
    return pair_ids(loaded, src_lines, tgt_lines, at=lambda side, i: (paths[side], i + 1))


#: Where pair ``i``'s source (side 0) or target (side 1) came from, as a
#: :class:`DataError` names it: a path and a line number, or a name alone.
Where = Callable[[int, int], tuple[str | Path, int | None]]


def pair_ids(loaded: Loaded, src_lines: Sequence[str], tgt_lines: Sequence[str], *,
             at: Where) -> tuple[list[list[int]], list[list[int]]]:
    """The ids of pairs of lines of text (as many of each), read as ``seqtrans score``
    reads them; a problem is a :class:`DataError` at the place ``at`` names."""
    task, codec = loaded.task, loaded.codec
    if not isinstance(task, TargetParsing):
        raise UsageError(f"task '{loaded.config.task}' cannot read targets from text (it has no "
                         "parse_target), so its pairs cannot be scored")
    sources, targets = [], []
    for i, (src_line, tgt_line) in enumerate(zip(src_lines, tgt_lines)):
        for side, line in enumerate((src_line, tgt_line)):
            if not line.strip():
                raise DataError(*at(side, i), "empty line: every line must hold a source or a target")
        source = task.parse_source(src_line)
        try:
            target = task.parse_target(tgt_line)
        except DataError as exc:
            raise DataError(*at(1, i), exc.problem) from None
        src_ids, tgt_ids = source_ids(codec, source), target_ids(codec, target)
        for model in loaded.models:
            problem = too_long(model.config, codec, source)
            if problem is not None:
                raise DataError(*at(0, i), problem)
            limit = model.config.position_limit
            if limit is not None and len(tgt_ids) + 1 > limit:
                raise DataError(*at(1, i), f"{len(tgt_ids) + 1} target tokens (with the start "
                                f"symbol), more than the {limit} positions the model learned "
                                "(model.max_positions)")
        sources.append(src_ids)
        targets.append(tgt_ids)
    return sources, targets


def score_files(loaded: Loaded, src_path: str | Path, tgt_path: str | Path, *,
                progress: bool = False) -> list[PairScore]:
    """The scores of the line pairs of two files, in input order, by the loaded model or
    ensemble, batched by ``decode.batch_tokens`` at ``decode.precision``."""
    return _score(loaded, *read_pairs(loaded, src_path, tgt_path), progress=progress)


def score_texts(loaded: Loaded, sources: Sequence[str], targets: Sequence[str], *,
                progress: bool = False) -> list[PairScore]:
    """The scores of pairs given as lists of lines of text (source ``i`` with target
    ``i``), as :func:`score_files` scores the same lines in two files. A problem is a
    :class:`DataError` naming the list and index (``targets[2]: empty line ...``); lists
    of anything but text, or of different lengths, a :class:`UsageError`."""
    hint = "score takes lines of text, as seqtrans score reads them (loaded.task.format_source of a source)"
    sources = check_texts(sources, argument="sources", instead=hint)
    targets = check_texts(targets, argument="targets", instead=hint)
    if len(sources) != len(targets):
        raise UsageError(f"sources and targets: {len(sources)} sources and {len(targets)} targets; every "
                         "source needs its target")
    names = ("sources", "targets")
    ids = pair_ids(loaded, sources, targets, at=lambda side, i: (f"{names[side]}[{i}]", None))
    return _score(loaded, *ids, progress=progress)


def _score(loaded: Loaded, sources: list[list[int]], targets: list[list[int]], *,
           progress: bool) -> list[PairScore]:
    decode = loaded.config.decode
    with reading(decode):
        return score_ids(loaded.searcher, sources, targets, batch_tokens=decode.batch_tokens,
                         device=loaded.device, precision=decode.precision, progress=progress,
                         given=len(forced_prefix(loaded.codec)))


def format_score(score: PairScore, *, alpha: float | None = None, kind: str = "gnmt") -> str:
    """``total<TAB>per-token<TAB>tokens``; with ``alpha``, the first column is the
    length-normalised score (lp of ``kind``) instead."""
    first = score.log_prob if alpha is None else score.normalized(alpha, kind=kind)
    return f"{first:.6f}\t{score.per_token:.6f}\t{score.tokens}"
