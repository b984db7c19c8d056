"""Scoring a split as streams (``seqtrans evaluate --stream``): each source pushed word by
word to a :class:`~seqtrans.streaming.session.StreamSession`, the outputs scored by the
task, and the latency in source words (:mod:`seqtrans.streaming.latency`).

The model reads and writes tokens (pieces); latency is reported in words, as SimulEval
counts them for text. A source's words are those of its input line
(:meth:`~seqtrans.tasks.SourceFormatting.format_source`, split on whitespace). A
hypothesis' words are those of its output line (:meth:`~seqtrans.tasks.Task.format`,
split on whitespace), and each has two delays (see :mod:`seqtrans.streaming.session`):

- the delay a reader of the text sees (``stream_ap``, ``stream_al``, ...): the source
  words read when the word is known to be complete, that is when the next target token
  begins a new word or when the end of the output is decided. This is what SimulEval
  measures for an agent that writes each word once it is complete
  (:mod:`seqtrans.streaming.simuleval`);
- the delay of its last piece (``stream_piece_ap``, ...), a lower bound of the first:
  the source words read when the word's last token was decided.

The reference length is that of the reference written back as an output line, counted
as SimulEval counts it. ``--instances FILE`` writes each sentence's output and delays
as SimulEval's ``instances.log`` does.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans.data.batches import check_sources, prediction
from seqtrans.errors import UsageError
from seqtrans.inference.evaluation import Split
from seqtrans.inference.loaded import Loaded
from seqtrans.runtime import atomic
from seqtrans.streaming.latency import REFERENCE, corpus_latency, reference_words, sentence_latency
from seqtrans.streaming.session import StreamSession, check_streaming, output_units, split_units
from seqtrans.tasks.protocol import Example, Metric, SourceFormatting, stream_unit


@dataclass(frozen=True)
class StreamedExample:
    """One streamed output: the prediction, its target tokens and their delays (source
    tokens read), and its words with their delays in source words."""

    prediction: Any
    tokens: list[int]
    token_delays: list[int]
    words: list[str]  # the output words as written
    word_delays: list[int]  # per output word: source words read when it was known complete
    piece_delays: list[int]  # per output word: source words read when its last piece was decided
    source_words: int


def source_words(loaded: Loaded, example: Example[Any, Any]) -> list[str]:
    """The words in which the example's source arrives."""
    task = loaded.task
    if not isinstance(task, SourceFormatting):
        raise UsageError(f"task '{loaded.config.task}' cannot write its sources as input lines "
                         "(format_source), which streaming a split word by word needs")
    return split_units(task.format_source(example.source), stream_unit(task))


def stream_example(loaded: Loaded, example: Example[Any, Any]) -> StreamedExample:
    """Decode one example's source as a stream of words (see the module docstring). An
    empty source has nothing to translate: its output is empty, with no delays."""
    words = source_words(loaded, example)
    if not words:
        return StreamedExample(prediction(loaded.codec, [], example.source), [], [], [], [], [], 0)
    session = StreamSession(loaded, origin=example.origin)
    session.push(words)
    session.finish()
    return StreamedExample(session.prediction, [t.id for t in session.tokens], session.token_delays,
                           [w.text for w in session.output_words], session.word_delays,
                           session.piece_delays, len(words))


def reference_text(loaded: Loaded, example: Example[Any, Any]) -> str:
    """The reference written as an output line: its target tokens through the task."""
    codec = loaded.codec
    return loaded.task.format(codec.prediction(codec.target_tokens(example.target), example.source))


def reference_length(loaded: Loaded, example: Example[Any, Any]) -> int:
    """The reference's length in words, as SimulEval counts it (in characters other than
    white space for a task that streams characters)."""
    return _length(reference_text(loaded, example), stream_unit(loaded.task))


def _length(reference: str, unit: str) -> int:
    return reference_words(reference) if unit == "words" else len(output_units(reference, unit))


def _latency(outputs: Sequence[StreamedExample], lengths: Sequence[int], field: str) -> dict[str, float]:
    return corpus_latency(sentence_latency(getattr(o, field), source_length=o.source_words,
                                           reference_length=n) for o, n in zip(outputs, lengths))


def score_stream(loaded: Loaded, split: Split, *,
                 instances: str | Path | None = None) -> tuple[list[StreamedExample], dict[str, Metric]]:
    """Stream every example of a split; the outputs and the metrics: the task's, and
    ``stream_ap``, ``stream_al``, ``stream_laal``, ``stream_dal`` in source words (as a
    reader of the text sees them), the same with the delays of each word's last piece
    (``stream_piece_*``), with ``stream_source_words`` (the mean source length in words),
    ``latency_unit``, ``latency_reference``, ``decode_sentences_per_s`` and ``skipped``.
    ``instances``: write each sentence in SimulEval's ``instances.log`` form there."""
    check_streaming(loaded)
    examples = split.examples
    check_sources(loaded.model.config, loaded.codec, examples)
    started = time.perf_counter()
    outputs = [stream_example(loaded, e) for e in examples]
    seconds = time.perf_counter() - started
    scores = loaded.task.score([o.prediction for o in outputs], examples)
    metrics: dict[str, Metric] = {k: v if isinstance(v, str) else float(v) for k, v in scores.items()}
    references = [reference_text(loaded, e) for e in examples]
    unit = stream_unit(loaded.task)
    lengths = [_length(r, unit) for r in references]
    # no sentence with a latency (every output empty): SimulEval fails; we leave the keys out
    for prefix, field in (("stream", "word_delays"), ("stream_piece", "piece_delays")):
        latency = _latency(outputs, lengths, field)
        metrics.update({f"{prefix}_{name}": value for name, value in latency.items()
                        if not math.isnan(value)})
    metrics["stream_source_words"] = sum(o.source_words for o in outputs) / max(len(outputs), 1)
    metrics["latency_unit"] = "word" if unit == "words" else "character"
    metrics["latency_reference"] = REFERENCE
    metrics["decode_sentences_per_s"] = round(len(examples) / max(seconds, 1e-9), 2)
    metrics["skipped"] = sum(split.skipped.values())
    if instances is not None:
        write_instances(instances, loaded, outputs, examples, references)
    return outputs, metrics


def write_instances(path: str | Path, loaded: Loaded, outputs: Sequence[StreamedExample],
                    examples: Sequence[Example[Any, Any]], references: Sequence[str]) -> Path:
    """Each sentence as a JSON line of SimulEval 1.1.4's ``instances.log`` for text: index,
    prediction, delays (in source words, as a reader sees them), elapsed (zeros, as
    SimulEval writes for text input), prediction_length, reference, source,
    source_length; written whole or not at all."""
    lines = []
    for index, (out, example, reference) in enumerate(zip(outputs, examples, references)):
        source = source_words(loaded, example)
        lines.append(json.dumps({
            "index": index, "prediction": " ".join(out.words), "delays": out.word_delays,
            "elapsed": [0] * len(out.word_delays), "prediction_length": len(out.words),
            "reference": reference, "source": " ".join(source), "source_length": len(source),
        }, ensure_ascii=False))
    return atomic.write_text(path, "".join(line + "\n" for line in lines))


def metrics_path(path: str | Path, *, split: str, overrides: Sequence[str] = ()) -> Path:
    """Where ``evaluate --stream`` writes its metrics unless told:
    ``RUN_DIR/metrics-stream-SPLIT[-CHECKPOINT][.OVERRIDES].json``. A checkpoint file's run
    directory is the one holding its ``checkpoints/`` (else its own directory), and its
    name (without ``.pt``) is added. OVERRIDES are the ``--set`` settings, the last of each
    key, sorted, ``decode.`` left out, joined by commas, with any character other than
    letters, digits and ``._=-`` written as ``_``: ``--set decode.wait_k=3`` gives
    ``metrics-stream-test.wait_k=3.json``, so that runs with other settings keep their files."""
    path = Path(path)
    name = f"metrics-stream-{split}"
    if path.is_file():
        name += f"-{path.stem}"
        path = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    settings: dict[str, str] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        settings[key.strip().removeprefix("decode.")] = value.strip()
    if settings:
        name += "." + ",".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return path / (re.sub(r"[^A-Za-z0-9._=,-]", "_", name) + ".json")
