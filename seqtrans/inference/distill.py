"""Sequence-level knowledge distillation (Kim and Rush 2016): a teacher's outputs for its
own training sources become the training targets of a student (``seqtrans distill``).

The teacher decodes its task's training split (``read("train")``, the settings of its
run, ``--set`` may change them) in chunks, with its decoding settings (beam search,
batched by length; ``decode.precision=int8`` allowed). The corpus is written for the
task to read back (:class:`~seqtrans.tasks.TrainingFiles`): ``train.src`` and
``train.tgt`` in the output directory, one example a line, and ``distill.json``, which
records the teacher and the settings and the ``data`` settings a student trains with.

The directory appears whole or not at all: chunks are written under ``OUT.partial/``,
each a file written whole (:mod:`seqtrans.runtime.atomic`), and the finished directory is renamed
into place. A distillation that is interrupted, by kill -9 too, resumes from its last
finished chunk; a chunk decodes to the same outputs whether it is decoded in the first
process or after a resumption (its sentences and their batches are the same), so the
corpus is the one an uninterrupted run writes.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shlex
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from seqtrans.config import to_dict
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.loading import Loaded, find_checkpoint, load
from seqtrans.prepare import examples_of
from seqtrans.runtime import atomic, download
from seqtrans.tasks.protocol import Example, TrainingFiles

log = logging.getLogger(__name__)

SOURCE, TARGET, RECORD = "train.src", "train.tgt", "distill.json"
_SETTINGS, _CHUNKS = "settings.json", "chunks"


@dataclass(frozen=True)
class Distilled:
    """A distilled corpus: its directory, its pairs, and the ``--set`` pairs (``data.KEY=VALUE``)
    under which a run of the teacher's task trains on it."""

    directory: Path
    task: str
    pairs: int
    overrides: list[str]

    def command(self, teacher: str | Path) -> str:
        """The command that trains a student on the corpus with the teacher's vocabulary."""
        return shlex.join(["seqtrans", "run", self.task, "--vocab", str(teacher), "--set", *self.overrides])


def distill(teacher: str | Path, out: str | Path, *, overrides: Sequence[str] = (), mix: bool = False,
            chunk: int = 2000, device: str = "auto", progress: bool = False) -> Distilled:
    """Translate the training sources of ``teacher`` (a run directory or checkpoint) with it
    into the corpus directory ``out``; ``overrides`` change its ``decode.*`` and ``data.*``
    settings; ``mix`` also keeps every original pair (each source then appears twice);
    ``chunk`` sentences are decoded and written at a time. A finished ``out`` made with the
    same settings is returned as it is."""
    if chunk < 1:
        raise UsageError(f"--chunk must be at least 1, got {chunk}")
    out = Path(out)
    loaded = load(teacher, overrides=overrides, device=device)
    task = loaded.task
    if not isinstance(task, TrainingFiles):
        raise UsageError(f"task '{loaded.config.task}' cannot read its training pairs from files the engine "
                         "writes (its task lacks the TrainingFiles ability), so it cannot be distilled")
    settings = _settings(teacher, loaded, mix=mix, chunk=chunk)
    if out.exists():
        return _finished(out, settings)
    partial = out.with_name(out.name + ".partial")
    _start(partial, settings)
    if not (partial / RECORD).is_file():
        done = _translate(loaded, task, partial / _CHUNKS, mix=mix, chunk=chunk, progress=progress)
        _assemble(partial, task, settings, pairs=done)
    shutil.rmtree(partial / _CHUNKS, ignore_errors=True)
    os.rename(partial, out)  # atomic: the corpus appears whole
    log.info("distilled corpus written to %s", out)
    return _finished(out, settings)


def _settings(teacher: str | Path, loaded: Loaded, *, mix: bool, chunk: int) -> dict[str, Any]:
    """What decides the corpus: the teacher's checkpoint (by its sha256), its decoding and data
    settings, ``mix`` and the chunk size (which decides the batches)."""
    path = find_checkpoint(teacher)
    return {"teacher": str(Path(teacher).resolve()), "checkpoint_sha256": download.sha256_file(path),
            "vocabulary_sha256": loaded.vocabulary_digest, "task": loaded.config.task,
            "decode": to_dict(loaded.config.decode), "data": to_dict(loaded.config.data),
            "mix": mix, "chunk": chunk}


def _start(partial: Path, settings: dict[str, Any]) -> None:
    """Begin ``partial``, or check that the interrupted distillation there had these settings."""
    saved = partial / _SETTINGS
    if saved.is_file():
        before = json.loads(saved.read_text(encoding="utf-8"))
        changed = sorted(k for k in settings if k != "teacher" and before.get(k) != settings[k])
        if changed:
            raise UsageError(f"{partial} holds an interrupted distillation with other settings "
                             f"({', '.join(changed)}); remove it, or resume with the same teacher and "
                             "settings")
        log.info("resuming the distillation in %s", partial)
        return
    (partial / _CHUNKS).mkdir(parents=True, exist_ok=True)
    atomic.write_json(saved, settings)


def _finished(out: Path, settings: dict[str, Any]) -> Distilled:
    """The corpus in ``out``, made with ``settings``; a UsageError when it was made otherwise."""
    try:
        record = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UsageError(f"{out} exists and is not a distilled corpus; choose another --out") from None
    changed = sorted(k for k in settings if k != "teacher" and record["settings"].get(k) != settings[k])
    if changed:
        raise UsageError(f"{out} holds a corpus distilled with other settings ({', '.join(changed)}); "
                         "choose another --out")
    return Distilled(out, settings["task"], int(record["pairs"]), list(record["student_overrides"]))


def _chunks(examples: Iterator[Example[Any, Any]], size: int) -> Iterator[list[Example[Any, Any]]]:
    while batch := list(itertools.islice(examples, size)):
        yield batch


def _translate(loaded: Loaded, task: TrainingFiles, chunks: Path, *, mix: bool, chunk: int,
               progress: bool) -> int:
    """Decode the training split chunk by chunk into ``chunks/NNNNNNN.jsonl`` (each line the
    [source, target] lines of one pair), skipping the chunks already written; the pairs."""
    total = sum(1 for _ in examples_of(loaded.task.read("train")))
    before = min(sum(1 for _ in chunks.glob("*.jsonl")) * chunk, total)
    pairs, rate = 0, _Rate(total, before)
    with tqdm(total=total, initial=before, desc="distill", unit=" sent", disable=not progress,
              smoothing=0.1) as bar:
        for index, examples in enumerate(_chunks(examples_of(loaded.task.read("train")), chunk)):
            path = chunks / f"{index:07d}.jsonl"
            if not path.is_file():
                predictions, _ = loaded.decode([e.source for e in examples],
                                               positions=range(index * chunk, index * chunk + len(examples)))
                rows = _rows(loaded, task, examples, predictions, mix=mix)
                atomic.write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
                bar.update(len(examples))
                rate.add(len(examples), log_line=not progress)
            pairs += len(examples) * (2 if mix else 1)
    return pairs


def _rows(loaded: Loaded, task: TrainingFiles, examples: list[Example[Any, Any]], predictions: list[Any], *,
          mix: bool) -> list[list[str]]:
    """The [source line, target line] pairs of a chunk: the teacher's output for every
    example, and with ``mix`` its original target too."""
    rows = []
    for example, prediction in zip(examples, predictions, strict=True):
        source = _one_line(task.format_source(example.source), example.origin)
        rows.append([source, _one_line(loaded.task.format(prediction), example.origin)])
        if mix:
            rows.append([source, _one_line(task.format_target(example.target), example.origin)])
    return rows


def _one_line(text: str, origin: str) -> str:
    if "\n" in text or "\r" in text:
        raise DataError(origin or None, None, "the task wrote it as more than one line")
    return text


class _Rate:
    """Sentences decoded in this process, for a log line a minute where no progress bar
    shows: sentences/s and the time left."""

    def __init__(self, total: int, before: int) -> None:
        self.total, self.before, self.finished = total, before, before
        self.started = self.reported = time.monotonic()

    def add(self, count: int, *, log_line: bool) -> None:
        self.finished += count
        now = time.monotonic()
        if not log_line or (now - self.reported < 60 and self.finished < self.total):
            return
        self.reported = now
        rate = (self.finished - self.before) / max(now - self.started, 1e-9)
        log.info("distill: %d of %d sentences, %.1f a second, about %.0f s left", self.finished, self.total,
                 rate, (self.total - self.finished) / max(rate, 1e-9))


def _assemble(partial: Path, task: TrainingFiles, settings: dict[str, Any], *, pairs: int) -> None:
    """Join the chunks into ``train.src`` and ``train.tgt`` and write ``distill.json`` (last: a
    partial directory with it is finished)."""
    chunk_files = sorted((partial / _CHUNKS).glob("*.jsonl"))
    with atomic.replacing(partial / SOURCE) as src, atomic.replacing(partial / TARGET) as tgt:
        for path in chunk_files:
            for line in path.read_text(encoding="utf-8").splitlines():
                source, target = json.loads(line)
                src.write((source + "\n").encode("utf-8"))
                tgt.write((target + "\n").encode("utf-8"))
    final = partial.with_name(partial.name.removesuffix(".partial"))
    data = task.training_files((final / SOURCE).resolve(), (final / TARGET).resolve())
    record = {"pairs": pairs, "settings": settings,
              "student_overrides": [f"data.{key}={value}" for key, value in data.items()]}
    atomic.write_json(partial / RECORD, record, ensure_ascii=False)
