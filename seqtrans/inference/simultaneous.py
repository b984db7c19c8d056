"""Scoring a split as streams (``seqtrans evaluate --stream``): each source fed word by
word to :func:`~seqtrans.decoding.streaming.stream_greedy`, the outputs scored by the
task, and the latency in source words (:mod:`seqtrans.decoding.latency`).

The model reads and writes tokens (pieces); latency is reported in words, as SimulEval
counts them for text. A source's words are those of its input line
(:meth:`~seqtrans.tasks.SourceFormatting.format_source`, split on whitespace); the
source tokens of its first k words must be a prefix of those of the whole source, as
for ``predict --stream``, so that "d tokens read" means "the words up to the one
holding token d have arrived". A hypothesis' words are those of its output line
(:meth:`~seqtrans.tasks.Task.format`, split on whitespace); a word is written with its
last token. The reference length is that of the reference written back as an output
line, counted as SimulEval counts it.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans.data import check_sources, prediction, source_ids
from seqtrans.decoding.latency import REFERENCE, corpus_latency, reference_words, sentence_latency
from seqtrans.decoding.streaming import stream_greedy
from seqtrans.errors import DataError, UsageError
from seqtrans.inference.ensemble import position_limit
from seqtrans.inference.evaluation import Split
from seqtrans.inference.loading import Loaded
from seqtrans.tasks.protocol import Example, Metric, SourceFormatting


@dataclass(frozen=True)
class StreamedExample:
    """One streamed output: the prediction, its target tokens' delays (source tokens
    read), and the same in words."""

    prediction: Any
    tokens: list[int]
    token_delays: list[int]
    word_delays: list[int]  # per output word: source words read when it was written
    source_words: int


def source_words(loaded: Loaded, example: Example[Any, Any]) -> list[str]:
    """The words in which the example's source arrives."""
    task = loaded.task
    if not isinstance(task, SourceFormatting):
        raise UsageError(f"task '{loaded.config.task}' cannot write its sources as input lines "
                         "(format_source), which streaming a split word by word needs")
    return task.format_source(example.source).split()


def word_ends(loaded: Loaded, words: Sequence[str], origin: str) -> list[int]:
    """For each k, the number of source tokens of the first k words (``ends[k - 1]``):
    token d (from 1) belongs to the first word k with ``ends[k - 1] >= d``."""
    task, codec = loaded.task, loaded.codec
    ends: list[int] = []
    fed: list[int] = []
    for k in range(1, len(words) + 1):
        ids = source_ids(codec, task.parse_source(" ".join(words[:k])))[:-1]
        if ids[: len(fed)] != fed:
            raise DataError(origin, None, "the task's tokens of the first words are not a prefix of those of "
                                          "more words: this task cannot be streamed word by word")
        ends.append(len(ids))
        fed = ids
    return ends


def source_word_delays(token_delays: Sequence[int], ends: Sequence[int]) -> list[int]:
    """Token delays as words read: the word holding the last token read (0 before any);
    every word once every token has been read, empty trailing words included."""
    return [0 if d == 0 else len(ends) if d >= ends[-1] else bisect.bisect_left(ends, d) + 1
            for d in token_delays]


def target_word_delays(loaded: Loaded, tokens: Sequence[int], delays: Sequence[int],
                       source: Any) -> list[int]:
    """The delays of the output's words (its formatted line split on whitespace), each
    that of its last token: the token after which the next word has begun, or the last."""
    counts = [len(loaded.task.format(prediction(loaded.codec, list(tokens[:i]), source)).split())
              for i in range(1, len(tokens) + 1)]
    total = counts[-1] if counts else 0
    out: list[int] = []
    for j in range(1, total + 1):
        # the (0-based) token with which word j + 1 begins
        nxt = next((i for i, c in enumerate(counts) if c > j), len(counts))
        last = nxt - 1 if nxt > 0 and counts[nxt - 1] >= j else nxt
        last = min(last, len(counts) - 1)
        out.append(delays[last] if not out else max(out[-1], delays[last]))
    return out


def stream_example(loaded: Loaded, example: Example[Any, Any]) -> StreamedExample:
    """Decode one example's source as a stream of words (see the module docstring). An
    empty source has nothing to translate: its output is empty, with no delays."""
    words = source_words(loaded, example)
    if not words:
        return StreamedExample(prediction(loaded.codec, [], example.source), [], [], [], 0)
    ends = word_ends(loaded, words, example.origin)
    ids = source_ids(loaded.codec, loaded.task.parse_source(" ".join(words)))[:-1]
    emissions = list(stream_greedy(loaded.model, ids, loaded.config.decode,
                                   position_limit=position_limit(loaded.model)))
    tokens = [e.token for e in emissions]
    token_delays = [e.delay for e in emissions]
    pred = prediction(loaded.codec, tokens, example.source)
    word_delays = source_word_delays(token_delays, ends)
    return StreamedExample(pred, tokens, token_delays,
                           target_word_delays(loaded, tokens, word_delays, example.source), len(words))


def reference_length(loaded: Loaded, example: Example[Any, Any]) -> int:
    """The reference's length in words: its target tokens written as an output line."""
    codec = loaded.codec
    text = loaded.task.format(codec.prediction(codec.target_tokens(example.target), example.source))
    return reference_words(text)


def score_stream(loaded: Loaded, split: Split) -> tuple[list[StreamedExample], dict[str, Metric]]:
    """Stream every example of a split; the outputs and the metrics: the task's, and
    ``stream_ap``, ``stream_al``, ``stream_laal``, ``stream_dal`` in source words, with
    ``stream_source_words`` (the mean source length in words), ``latency_unit``,
    ``latency_reference``, ``decode_sentences_per_s`` and ``skipped``."""
    from seqtrans.inference.online import check_streaming

    check_streaming(loaded)
    examples = split.examples
    check_sources(loaded.model.config, loaded.codec, examples)
    started = time.perf_counter()
    outputs = [stream_example(loaded, e) for e in examples]
    seconds = time.perf_counter() - started
    scores = loaded.task.score([o.prediction for o in outputs], examples)
    metrics: dict[str, Metric] = {k: v if isinstance(v, str) else float(v) for k, v in scores.items()}
    latency = corpus_latency(sentence_latency(o.word_delays, source_length=o.source_words,
                                              reference_length=reference_length(loaded, e))
                             for o, e in zip(outputs, examples))
    # no sentence with a latency (every output empty): SimulEval fails; we leave the keys out
    metrics.update({f"stream_{name}": value for name, value in latency.items() if not math.isnan(value)})
    metrics["stream_source_words"] = sum(o.source_words for o in outputs) / max(len(outputs), 1)
    metrics["latency_unit"] = "word"
    metrics["latency_reference"] = REFERENCE
    metrics["decode_sentences_per_s"] = round(len(examples) / max(seconds, 1e-9), 2)
    metrics["skipped"] = float(sum(split.skipped.values()))
    return outputs, metrics


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
