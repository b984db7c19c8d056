"""Latency of simultaneous decoding, per sentence and per corpus, exactly as SimulEval
1.1.4 computes it for text (``simuleval/evaluator/scorers/latency_scorer.py``).

``delays[i]`` is the number of source units (words for ``evaluate --stream``, tokens for
``predict --stream``) read when target unit i + 1 was written, counted from 1; a unit
written after the whole source was read has delay ``source_length``. The metrics:

- AP, average proportion (Cho and Esipova 2016): ``sum(delays) / (|x| * target_length)``;
- AL, average lagging (Ma et al. 2019): ``1/tau sum_{i<=tau} (g(i) - (i - 1) / gamma)``
  with ``gamma = target_length / |x|`` and tau the first i with ``g(i) >= |x|``;
- LAAL, length-adaptive average lagging (Papi et al. 2022): AL with
  ``gamma = max(|y|, target_length) / |x|``, |y| the hypothesis length;
- DAL, differentiable average lagging (Cherry and Foster 2019): the mean of
  ``g'(i) - (i - 1) / gamma`` with ``g'(1) = g(1)``, ``g'(i) = max(g(i), g'(i-1) + 1/gamma)``
  and ``gamma = |y| / |x|``.

``target_length`` is what SimulEval uses: the reference length when a reference is given
(its default, ``use_ref_len``), else the hypothesis length. So AP and AL use the
reference length, LAAL the larger of both, and DAL always the hypothesis length (its
scorer ignores the reference). The version matters: SimulEval up to 1.1.3 tested
``use_ref_len`` the other way round, and took the hypothesis length where a reference
was given; AP and AL of those versions differ from these whenever the lengths differ.
Also as SimulEval: AL and LAAL are ``delays[0]`` when ``delays[0] > |x|``.

Where SimulEval fails, these functions return NaN: an empty hypothesis (no delays; its
scorer asserts) and an empty source (it divides by zero). The corpus score is the mean
over sentences (:func:`corpus_latency`); SimulEval leaves out sentences without delays,
and so do we, with those whose score is NaN; with no sentence left it is NaN (SimulEval
raises).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

#: SimulEval's version whose definitions these are.
REFERENCE = "simuleval 1.1.4"


def average_proportion(delays: Sequence[float], *, source_length: int, target_length: int) -> float:
    """AP (Cho and Esipova 2016): 1 for reading everything first."""
    if not delays or source_length == 0:
        return math.nan
    return sum(delays) / (source_length * target_length)


def _lagging(delays: Sequence[float], source_length: int, gamma_length: int) -> float:
    if delays[0] > source_length:
        return float(delays[0])
    gamma = gamma_length / source_length
    total = 0.0
    tau = 0
    for i, d in enumerate(delays):  # i = t - 1
        total += d - i / gamma
        tau = i + 1
        if d >= source_length:
            break
    return total / tau


def average_lagging(delays: Sequence[float], *, source_length: int, target_length: int) -> float:
    """AL (Ma et al. 2019): k for wait-k when target_length equals |x|."""
    if not delays or source_length == 0:
        return math.nan
    return _lagging(delays, source_length, target_length)


def length_adaptive_average_lagging(delays: Sequence[float], *, source_length: int,
                                    target_length: int) -> float:
    """LAAL (Papi et al. 2022): AL whose rate is the longer of hypothesis and target, so an
    over-long hypothesis earns no lower lagging."""
    if not delays or source_length == 0:
        return math.nan
    return _lagging(delays, source_length, max(len(delays), target_length))


def differentiable_average_lagging(delays: Sequence[float], *, source_length: int,
                                   target_length: int) -> float:
    """DAL (Cherry and Foster 2019). ``target_length`` is ignored, as SimulEval does: the
    rate is always that of the hypothesis."""
    del target_length
    if not delays or source_length == 0:
        return math.nan
    gamma = len(delays) / source_length
    total = 0.0
    previous = 0.0
    for i, g in enumerate(delays):
        current = g if i == 0 else max(g, previous + 1 / gamma)
        total += current - i / gamma
        previous = current
    return total / len(delays)


#: The metrics by their short names, in the order they are reported.
METRICS: dict[str, Callable[..., float]] = {
    "ap": average_proportion,
    "al": average_lagging,
    "laal": length_adaptive_average_lagging,
    "dal": differentiable_average_lagging,
}


def target_length(delays: Sequence[float], reference_length: int | None) -> int:
    """The length SimulEval's scorers take as the target's (``use_ref_len``): the
    reference's when there is one, else the hypothesis'."""
    return len(delays) if reference_length is None else reference_length


def sentence_latency(delays: Sequence[float], *, source_length: int,
                     reference_length: int | None = None) -> dict[str, float]:
    """Every metric of one sentence by name (:data:`METRICS`); NaN where undefined."""
    length = target_length(delays, reference_length)
    return {name: metric(delays, source_length=source_length, target_length=length)
            for name, metric in METRICS.items()}


def corpus_latency(sentences: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each metric over the sentences that have it (not NaN): SimulEval's
    corpus score, which leaves out sentences without delays."""
    totals = dict.fromkeys(METRICS, 0.0)
    counts = dict.fromkeys(METRICS, 0)
    for scores in sentences:
        for name in METRICS:
            value = scores[name]
            if not math.isnan(value):
                totals[name] += value
                counts[name] += 1
    return {name: totals[name] / counts[name] if counts[name] else math.nan for name in METRICS}


def reference_words(text: str) -> int:
    """A reference's length in words as SimulEval counts it (``len(ref.split(" "))`` of
    the stripped line: an empty reference counts 1)."""
    return len(text.strip().split(" "))
