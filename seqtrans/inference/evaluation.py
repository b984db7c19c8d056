"""Decoding many sources and scoring a split: what ``evaluate``, ``run``'s test
decoding and validation share.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from seqtrans.config import DecodeConfig
from seqtrans.data.batches import check_sources, prediction, source_ids
from seqtrans.data.encoding import forced_prefix
from seqtrans.decoding import Hypothesis, generate
from seqtrans.decoding.beam import Cancelled
from seqtrans.decoding.ensemble import Ensemble, members, position_limit
from seqtrans.decoding.lexical import Phrases
from seqtrans.inference.phrases import banned_ids
from seqtrans.model.transformer import Transformer
from seqtrans.shortlist.table import Shortlist
from seqtrans.tasks.protocol import (
    Codec,
    Constraining,
    Example,
    Metric,
    Skipped,
    Task,
    check_split,
)
from seqtrans.training import distributed

log = logging.getLogger(__name__)


def decode_sources(model: Transformer | Ensemble, codec: Codec[Any, Any, Any], sources: Sequence[Any],
                   decode: DecodeConfig, *, device: torch.device, progress: bool = False,
                   spread: bool = False, positions: Sequence[int] | None = None,
                   prefixes: Sequence[list[int]] | None = None, required: Sequence[Phrases] | None = None,
                   banned: Sequence[Phrases] | None = None, cancelled: Cancelled | None = None,
                   shortlist: Shortlist | None = None) -> tuple[list[Any], list[list[Hypothesis]]]:
    """Predictions and n-best hypotheses of ``sources``, in order. With ``spread``, in a
    process group, every rank decodes a share (by length, in turn) and all ranks get
    all outputs back in input order. ``positions``: each source's position in the whole
    input, which seeds its sampling stream (default: its index in ``sources``);
    ``prefixes``: the target ids each output must start with (scored, not searched);
    ``required`` and ``banned``: per source, phrases of target ids its outputs must and
    must not contain; ``cancelled(i)``: whether source i's output is no longer wanted
    (:func:`~seqtrans.decoding.generate`; not with ``spread``); ``shortlist``: the
    vocabulary shortlist ``decode.shortlist`` decodes with."""
    positions = range(len(sources)) if positions is None else positions
    world = distributed.current()
    if spread and world.distributed:
        lengths = [len(source_ids(codec, s)) for s in sources]
        mine = distributed.spread(lengths, world)
        preds, hyps = decode_sources(model, codec, [sources[i] for i in mine], decode, device=device,
                                     progress=progress and world.main,
                                     positions=[positions[i] for i in mine],
                                     prefixes=None if prefixes is None else [prefixes[i] for i in mine],
                                     required=None if required is None else [required[i] for i in mine],
                                     banned=None if banned is None else [banned[i] for i in mine],
                                     shortlist=shortlist)
        return (distributed.gather_in_order(len(sources), mine, preds),
                distributed.gather_in_order(len(sources), mine, hyps))
    ids = [source_ids(codec, s) for s in sources]
    forced = forced_prefix(codec)
    if forced:  # a target language's code, say
        prefixes = [list(p) if list(p[: len(forced)]) == forced else forced + list(p)
                    for p in (prefixes or [[] for _ in sources])]
    limit = position_limit(model)
    constraints = None
    if isinstance(codec, Constraining):
        constrained = codec

        def constraints(idx: list[int]) -> Any:
            return constrained.constraint([sources[i] for i in idx])

    hyps = generate(model, ids, decode, device=device, constraints=constraints,
                    position_limit=limit, positions=positions, prefixes=prefixes, required=required,
                    banned=banned, given=len(forced), progress=progress, cancelled=cancelled,
                    shortlist=shortlist)
    preds = [prediction(codec, h[0].tokens if h else [], s) for h, s in zip(hyps, sources)]
    return preds, hyps


@dataclass
class Split:
    """The examples of one split, and what the task left out of it (:class:`Skipped`)."""

    examples: list[Example[Any, Any]]
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count


def read_split(task: Task[Any, Any, Any], split: str) -> Split:
    """Read a split whole; the inputs the task left out are counted by reason and logged
    with the first origin of each reason."""
    check_split(split)
    out = Split([])
    first: dict[str, str] = {}
    for item in task.read(split):
        if isinstance(item, Skipped):
            out.skipped[item.reason] += 1
            first.setdefault(item.reason, item.origin)
        else:
            out.examples.append(item)
    for reason, count in out.skipped.items():  # the task's own choice (a filter): news, not a problem
        log.info("%s: left out %d of %d inputs: %s (first: %s)", split, count,
                 len(out.examples) + sum(out.skipped.values()), reason, first[reason])
    return out


def score_examples(model: Transformer | Ensemble, task: Task[Any, Any, Any], codec: Codec[Any, Any, Any],
                   split: Split, decode: DecodeConfig, *, device: torch.device,
                   progress: bool = False, shortlist: Shortlist | None = None,
                   ) -> tuple[list[Any], dict[str, Metric]]:
    """Decode and score a split: the predictions and the task's metrics, plus
    ``decode_sentences_per_s``, ``skipped`` (the inputs the task left out of the split)
    and, with ``decode.compare_unconstrained``, ``unconstrained_*``. The phrases of
    ``decode.banned`` are kept out of every output; ``shortlist`` is what
    ``decode.shortlist`` decodes with. In a process group the ranks decode a
    share each and rank 0's scores are returned on all."""
    examples = split.examples
    for member in members(model):
        check_sources(member.config, codec, examples)
    sources = [e.source for e in examples]
    main = distributed.current().main
    started = time.perf_counter()
    common = banned_ids(task, codec, decode)
    banned = [common] * len(sources) if common else None
    preds, _ = decode_sources(model, codec, sources, decode, device=device, progress=progress,
                              spread=True, banned=banned, shortlist=shortlist)
    seconds = time.perf_counter() - started
    metrics = _metrics(task.score(preds, examples)) if main else {}
    metrics["decode_sentences_per_s"] = round(len(examples) / max(seconds, 1e-9), 2)
    metrics["skipped"] = sum(split.skipped.values())
    if decode.compare_unconstrained and decode.constrained and isinstance(codec, Constraining):
        free = dataclasses.replace(decode, constrained=False)
        free_preds, _ = decode_sources(model, codec, sources, free, device=device, spread=True, banned=banned,
                                       shortlist=shortlist)
        if main:
            free_scores = _metrics(task.score(free_preds, examples))
            metrics.update({f"unconstrained_{k}": v for k, v in free_scores.items()})
    return preds, distributed.broadcast(metrics)


def _metrics(scores: Mapping[str, Metric]) -> dict[str, Metric]:
    """Numbers as floats; strings (signatures) kept as they are."""
    return {k: v if isinstance(v, str) else float(v) for k, v in scores.items()}


def numeric(scores: Mapping[str, Metric]) -> dict[str, float]:
    """The numeric metrics only: what validation and early stopping compare."""
    return {k: float(v) for k, v in scores.items() if not isinstance(v, str)}
