"""Decoding input lines as they arrive (``seqtrans predict``): reading them, in batches of
what has arrived, and decoding each batch at once. ``--stream``, word by word, is
:mod:`seqtrans.streaming.predict`."""

from __future__ import annotations

import logging
import os
import select
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from seqtrans.data.batches import source_ids, too_long
from seqtrans.data.encoding import forced_prefix
from seqtrans.data.vocab import UNK
from seqtrans.decoding.lexical import Phrases
from seqtrans.decoding.search import Hypothesis
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.lexical import ConstraintLines, loaded_target_ids
from seqtrans.inference.loaded import Loaded
from seqtrans.inference.output import TEXT, OutputOptions, render, render_failure
from seqtrans.tasks.protocol import SourceFormatting

log = logging.getLogger(__name__)


def predict(loaded: Loaded, lines: Iterable[str], *, prefixes: bool = False,
            output: OutputOptions = TEXT, constraints: ConstraintLines | None = None) -> Iterator[str]:
    """One output per input line, as each is decoded. With ``decode.nbest`` (or
    ``decode.sample``) > 1, each input gives that many lines ``rank<TAB>score<TAB>output``
    (samples in the order drawn) and an empty line. With ``prefixes``, a line is
    ``source<TAB>target prefix``; ``output`` chooses the format and the fields (see
    :func:`predict_batches`)."""
    if isinstance(lines, (str, bytes)):  # iterating it would decode each character as a line
        raise UsageError(f"lines: expected an iterable of lines of text, got the {type(lines).__name__} "
                         f"{lines[:40]!r}; wrap one line in a list")
    return predict_batches(loaded, ([line.rstrip("\n")] for line in lines), prefixes=prefixes, output=output,
                           constraints=constraints)


def predict_batches(loaded: Loaded, batches: Iterable[list[str]], *, name: str = "<stdin>",
                    prefixes: bool = False, output: OutputOptions = TEXT,
                    constraints: ConstraintLines | None = None) -> Iterator[str]:
    """The outputs of batches of input lines (without line ends), in input order. Each
    batch is decoded at once, sorted by length into batches of ``decode.batch_tokens``,
    so a file decodes at batch speed; a batch of one line is answered at once.

    Symbols the model has never seen are read as ``<unk>`` and logged with the line
    (``name:line``); a source the task cannot read, or longer than learned positions
    reach, is a :class:`DataError` naming its line, raised once the outputs of the lines
    before it are given.

    With ``prefixes``, each line is ``source<TAB>prefix`` (a line without a tab has no
    prefix): the output starts with the prefix, read as the task reads a target and
    scored, not searched (:func:`seqtrans.decoding.generate`). A prefix the task cannot
    read, or with a token outside the model's target vocabulary, is logged as an error
    naming the line, which gets an empty output; the other lines are decoded, and a
    :class:`DataError` naming the first such line ends the output.

    ``constraints``: a line of required and banned phrases per input line
    (:class:`~seqtrans.inference.lexical.ConstraintLines`); a line whose phrases cannot be
    read or searched is an error as a bad prefix is.

    ``output`` (:class:`~seqtrans.inference.output.OutputOptions`): text lines, with the
    alignment and the per-token log-probabilities as further tab-separated columns when
    asked for, or one JSON object per input; these fields cost one teacher-forced pass
    over the outputs (:mod:`seqtrans.inference.details`)."""
    number = 0
    failed: list[DataError] = []
    for lines in batches:
        first = number
        number += len(lines)
        batch = _read_lines(loaded, lines, first=first, name=name, prefixes=prefixes,
                            constraints=constraints, failed=failed)
        outputs = _outputs(loaded, batch, first=first, prefixes=prefixes, output=output)
        for i in range(len(lines) if batch.stop is None else batch.stop.index):
            yield from outputs[i]
        if batch.stop is not None:  # the lines before it are written; the error ends the output
            raise batch.stop.error
    if constraints is not None:
        try:
            constraints.finish()
        except DataError as exc:
            log.error("%s", exc)
            failed.append(exc)
    if failed:
        earliest = failed[0]
        raise DataError(earliest.path, earliest.line,
                        f"{earliest.problem} ({len(failed)} line(s) left without output; the other lines "
                        "were decoded)")


def _outputs(loaded: Loaded, batch: _Lines, *, first: int, prefixes: bool,
             output: OutputOptions) -> dict[int, list[str]]:
    """The output lines of each line of a batch read (the first numbered ``first + 1``),
    by its index in the batch: decoded, or the failure of a line that could not be."""
    outputs = {i: render_failure(loaded, output, number=first + i + 1, problem=problem)
               for i, problem in batch.problems.items()}
    if not batch.sources:
        return outputs
    _, hyps = loaded.decode(batch.sources, positions=[first + i for i in batch.good],
                            prefixes=batch.forced if prefixes else None, required=batch.required,
                            banned=batch.banned)
    aligned = _details(loaded, batch.sources, hyps, output) if output.details else None
    if output.token_log_probs and aligned is not None:
        hyps = aligned[0]
    for k, (i, source, nbest_hyps) in enumerate(zip(batch.good, batch.sources, hyps)):
        outputs[i] = render(loaded, output, number=first + i + 1, source=source, hyps=nbest_hyps,
                            alignments=aligned[1][k] if aligned is not None and output.alignments else None)
    return outputs


@dataclass(frozen=True)
class _Stop:
    """A line no output can be given for (``index`` in its batch): the lines before it are
    decoded and written, then ``error`` ends the output."""

    index: int
    error: DataError


@dataclass
class _Lines:
    """A batch of input lines as read: the sources that can be decoded (the batch's lines
    ``good``), their forced prefixes and phrases, the problems of the others by line, and
    the line that ends the input, if one does."""

    sources: list[Any] = field(default_factory=list)
    good: list[int] = field(default_factory=list)
    forced: list[list[int]] = field(default_factory=list)
    required: list[Phrases] = field(default_factory=list)
    banned: list[Phrases] = field(default_factory=list)
    problems: dict[int, str] = field(default_factory=dict)
    stop: _Stop | None = None


def _read_lines(loaded: Loaded, lines: list[str], *, first: int, name: str, prefixes: bool,
                constraints: ConstraintLines | None, failed: list[DataError]) -> _Lines:
    """Parse a batch of input lines (the first numbered ``first + 1``); a line whose
    prefix or phrases cannot be read is logged, added to ``failed`` and left out; a source
    that cannot be read or decoded stops the reading there (``stop``)."""
    batch = _Lines()
    for i, line in enumerate(lines):
        number = first + i + 1
        text, _, prefix = line.partition("\t") if prefixes else (line, "", "")
        try:
            source = loaded.task.parse_source(text)
            _check_source(loaded, source, name, number, text)
        except DataError as exc:  # the task names no line: it was given the text alone
            error = exc if exc.path is not None else DataError(name, number, exc.problem)
            batch.stop = _Stop(i, error)
            break
        try:
            own_prefix = prefix_ids(loaded, prefix, name, number) if prefix else []
            lexical = (constraints.take(loaded, source_ids(loaded.codec, source), own_prefix)
                       if constraints is not None else None)
        except DataError as exc:
            log.error("%s", exc)
            failed.append(exc)
            batch.problems[i] = exc.problem
            continue
        batch.forced.append(own_prefix)
        batch.required.append(lexical.required if lexical else [])
        batch.banned.append(lexical.banned if lexical else [])
        batch.sources.append(source)
        batch.good.append(i)
    return batch

def _details(loaded: Loaded, sources: list[Any], hyps: list[list[Hypothesis]], output: OutputOptions,
             ) -> tuple[list[list[Hypothesis]], list[list[list[tuple[int, int]]]]]:
    """The hypotheses with their per-token log-probabilities (when asked for) and the
    word alignments of each (empty lists when not asked for)."""
    from seqtrans.inference.details import attention_weights, with_token_log_probs, word_alignments

    ids = [source_ids(loaded.codec, s) for s in sources]
    decode = loaded.config.decode
    if output.token_log_probs:
        hyps = with_token_log_probs(loaded.searcher, ids, hyps, decode=decode, device=loaded.device,
                                    given=len(forced_prefix(loaded.codec)))
    if not output.alignments:
        return hyps, [[[] for _ in nbest] for nbest in hyps]
    pairs = [(i, h) for i, nbest in enumerate(hyps) for h in nbest]
    weights = attention_weights(loaded.searcher, [ids[i] for i, _ in pairs], [h.tokens for _, h in pairs],
                                layer=output.alignment_layer, device=loaded.device,
                                batch_tokens=decode.batch_tokens)
    aligned: list[list[list[tuple[int, int]]]] = [[] for _ in hyps]
    for (i, h), w in zip(pairs, weights):
        aligned[i].append(word_alignments(loaded.codec, sources[i], h.tokens, w))
    return hyps, aligned


def prefix_ids(loaded: Loaded, text: str, name: str, number: int) -> list[int]:
    """The target ids of a target prefix given as text, read as the task reads a target;
    a :class:`DataError` naming the line if the task cannot read it or the model's target
    vocabulary lacks one of its tokens."""
    return loaded_target_ids(loaded, text, what="target prefix", name=name, number=number)


def unseen(loaded: Loaded, source: object) -> list[str]:
    """The source's tokens that are not in the model's source vocabulary (read as ``<unk>``)."""
    vocab = loaded.codec.vocabularies.source
    return [t for t in loaded.codec.source_tokens(source) if vocab.index(t) == UNK]


def warn_unseen(loaded: Loaded, source: object, name: str, number: int, *, text: str | None = None) -> None:
    """Log the source's symbols that the model has never seen (read as ``<unk>``), with
    where the source came from (``name:number``) and the input ``text`` (by default, the
    source as a task that can write it writes it), so that the line is found at a glance."""
    unknown = unseen(loaded, source)
    if unknown:
        shown = ", ".join(repr(t) for t in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
        if text is None and isinstance(loaded.task, SourceFormatting):
            text = loaded.task.format_source(source)
        quoted = "" if text is None else ", in the input " + repr(text[:QUOTED] + ("..." if len(text) > QUOTED
                                                                                    else ""))
        log.warning("%s:%d: %d symbol(s) the model has never seen, read as <unk>: %s%s", name, number,
                    len(unknown), shown, quoted)


#: The most characters of an input a warning quotes.
QUOTED = 100


def _check_source(loaded: Loaded, source: object, name: str, number: int, text: str) -> None:
    warn_unseen(loaded, source, name, number, text=text)
    for model in loaded.models:
        problem = too_long(model.config, loaded.codec, source)
        if problem is not None:
            raise DataError(name, number, problem)


def line_batches(fd: int, *, max_lines: int = 1000, name: str = "<stdin>") -> Iterator[list[str]]:
    """Lines of the file descriptor ``fd`` in batches: each batch holds the lines that have
    arrived and no more than ``max_lines``. A file or a full pipe gives full batches; a
    line typed at a terminal, or sent by a program that waits for its answer, forms a
    batch of its own at once. Invalid UTF-8 is a :class:`DataError` naming the line,
    raised once the lines before it have been given."""
    pending: list[str] = []
    buffer = b""
    number = 0
    while True:
        while len(pending) >= max_lines:
            yield pending[:max_lines]
            del pending[:max_lines]
        if pending and not select.select([fd], [], [], 0)[0]:
            yield pending  # nothing more has arrived: answer what has
            pending = []
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            break
        *complete, buffer = (buffer + data).split(b"\n")
        error = _decode_lines(complete, pending, first=number, name=name)
        number += len(complete)
        if error is not None:
            yield from _chunks(pending, max_lines)
            raise error
    error = _decode_lines([buffer] if buffer else [], pending, first=number, name=name)
    yield from _chunks(pending, max_lines)
    if error is not None:
        raise error


def _decode_lines(raw: list[bytes], into: list[str], *, first: int, name: str) -> DataError | None:
    """Append the lines ``raw`` (the first numbered ``first + 1``) as text to ``into`` up to
    the first that is not UTF-8, and return the error naming that one."""
    for i, line in enumerate(raw):
        try:
            into.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return DataError(name, first + i + 1, f"invalid UTF-8 at byte {exc.start + 1} of the line")
    return None


def _chunks(lines: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(lines), size):
        yield lines[start:start + size]
