"""Decoding many inputs: batches of similar length, results back in input order."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from seqtrans.attention import reading
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.decoding.beam import Cancelled, beam_search, greedy_search, sample_search
from seqtrans.decoding.constraints import Constraint
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.decoding.lexical import Phrases, required_problem
from seqtrans.decoding.protocol import SearchModel
from seqtrans.decoding.sampling import Truncation, input_uniforms
from seqtrans.decoding.search import Hypothesis
from seqtrans.errors import ConfigError
from seqtrans.linear.onednn import onednn_available
from seqtrans.linear.precision import autocast
from seqtrans.linear.quantize import is_int8_only, onednn_cached, quantized_cached
from seqtrans.model.transformer import Transformer
from seqtrans.runtime import buffers, environment
from seqtrans.runtime.heartbeat import Counter
from seqtrans.shortlist.search import Shortlisted
from seqtrans.shortlist.table import Shortlist

log = logging.getLogger(__name__)

ConstraintFactory = Callable[[list[int]], "Constraint | None"]


def max_output_length(source_length: int, config: DecodeConfig, *, limit: int | None = None) -> int:
    """a * |x| + b tokens before the end symbol; |x| excludes the source's end symbol."""
    length = int(math.floor(config.max_len_a * source_length + config.max_len_b))
    return max(1, min(length, limit) if limit is not None else length)


def length_batches(lengths: Sequence[int], max_tokens: int) -> Iterator[list[int]]:
    """Indices grouped by similar length, each group with at most ``max_tokens`` padded tokens
    (a longer single input still forms its own group)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if batch and longest_if_added * (len(batch) + 1) > max_tokens:
            yield batch
            batch, longest_if_added = [], lengths[i]
        batch.append(i)
        longest = longest_if_added
    if batch:
        yield batch


def decoding_model(model: SearchModel, precision: str, device: torch.device) -> SearchModel:
    """What ``generate`` decodes with in a ``decode.precision`` setting: the int8 copy
    (:func:`seqtrans.linear.quantize.quantized`); for fp32 on a CPU the copy whose linear layers
    multiply through oneDNN (:func:`seqtrans.linear.quantize.onednn`; ``SEQTRANS_TUNE_MATMUL=0``
    keeps ``F.linear``); else the model itself. For an ensemble, of every member."""
    members = model.models if isinstance(model, Ensemble) else [model]
    if precision != "int8" and any(is_int8_only(m) for m in members):
        raise ConfigError("decode.precision", f"{precision} needs the float weights, which a model loaded "
                          "with decode.precision=int8 does not keep; load it in fp32 to decode in "
                          f"{precision}")
    if precision == "int8":
        make = quantized_cached
    elif (precision == "fp32" and device.type == "cpu" and onednn_available()
          and environment.tune_matmul()):
        make = onednn_cached
    else:
        return model
    if isinstance(model, Ensemble):
        return Ensemble([make(m) for m in model.models], model.weights)
    if not isinstance(model, Transformer):
        if precision == "int8":
            raise TypeError(f"int8 decoding needs a Transformer or an Ensemble, not {type(model).__name__}")
        return model
    return make(model)


def generate(model: SearchModel, sources: Sequence[list[int]], config: DecodeConfig, *,
             device: torch.device, constraints: ConstraintFactory | None = None,
             position_limit: int | None = None, positions: Sequence[int] | None = None,
             prefixes: Sequence[list[int]] | None = None, required: Sequence[Phrases] | None = None,
             banned: Sequence[Phrases] | None = None, given: int = 0, progress: bool = False,
             cancelled: Cancelled | None = None,
             shortlist: Shortlist | None = None) -> list[list[Hypothesis]]:
    """The n-best hypotheses of every source (ids ending in EOS), in input order; with
    ``decode.sample``, that many samples of each, in the order drawn. With
    ``decode.shortlist``, the output projection covers only ``shortlist``'s tokens for each
    batch (:mod:`seqtrans.shortlist.search`; the tokens of prefixes and required phrases
    are allowed too); ConfigError when there is none or the model is an ensemble.

    ``decode.wait_k`` sets the wait-k lag and ``decode.monotonic_threshold`` the learned
    policies' stopping threshold (:func:`seqtrans.attention.reading`).
    ``constraints(indices)`` returns the task's constraint for the sources at those indices
    (its ``rows`` are positions in that list). ``position_limit`` caps output lengths
    (learned positions). ``positions``: each source's position in the whole input (its
    line), which seeds its sampling stream; by default its index in ``sources``.
    ``prefixes``: target ids each output must start with (scored, not searched; the
    output may be as long as its prefix even where the maximum length is shorter); the
    first ``given`` tokens of every prefix are read, not scored (a family's forced first
    token: :func:`~seqtrans.decoding.beam.beam_search`).
    ``required``: per source, phrases (target ids) its outputs must contain, searched by
    beam search with dynamic beam allocation even at ``decode.beam`` 1
    (:mod:`seqtrans.decoding.lexical`); ``banned``: per source, phrases they must not
    contain. ``cancelled(i)``: whether source i's output is no longer wanted, asked
    between steps; a cancelled source is not started, or leaves its batch at the next step
    with whatever it has finished (:data:`~seqtrans.decoding.beam.Cancelled`). ValueError
    naming the input whose required phrases the beam or its maximum length cannot hold, or
    when sampling is asked for with required phrases.
    """
    if required is not None and any(required):
        _check_required(sources, required, config, position_limit=position_limit, prefixes=prefixes)
    model = decoding_model(model, config.precision, device)
    searcher = _shortlisted(model, shortlist if config.shortlist else None, config)
    with reading(config), buffers.reused():
        return _generate(searcher, sources, config, device=device, constraints=constraints,
                         position_limit=position_limit,
                         positions=range(len(sources)) if positions is None else positions,
                         prefixes=prefixes, given=given, lexical=_Lexical(required, banned),
                         progress=progress, cancelled=cancelled)


Searcher = Callable[[Sequence[Sequence[int]] | None, bool], SearchModel]


def _shortlisted(model: SearchModel, shortlist: Shortlist | None, config: DecodeConfig) -> Searcher:
    """What decodes a batch whose sources may also produce the ``extra`` target ids (and
    whose search needs scores over the whole vocabulary, ``whole``: required phrases):
    ``model``, or with ``decode.shortlist`` the model restricted to ``shortlist``."""
    if not config.shortlist:
        return lambda extra, whole: model
    if shortlist is None:
        raise ConfigError("decode.shortlist", "this run has no shortlist loaded; build it with "
                          "'seqtrans shortlist RUN_DIR'")
    if not isinstance(model, Transformer):
        raise ConfigError("decode.shortlist", f"restricts one model's output projection, not a "
                          f"{type(model).__name__} (an ensemble)")
    return lambda extra, whole: Shortlisted(model, shortlist, extra=extra, compact=not whole)


def _check_required(sources: Sequence[list[int]], required: Sequence[Phrases], config: DecodeConfig, *,
                    position_limit: int | None, prefixes: Sequence[list[int]] | None) -> None:
    if config.sample:
        raise ValueError("required phrases need a search: sampling (decode.sample) cannot guarantee them")
    if len(required) != len(sources):
        raise ValueError(f"required phrases for {len(required)} inputs, but {len(sources)} inputs")
    for i, (source, phrases) in enumerate(zip(sources, required)):
        length = max_output_length(len(source) - 1, config, limit=position_limit)
        if prefixes is not None:
            length = max(length, len(prefixes[i]))
        problem = required_problem(phrases, beam=config.beam, max_len=length)
        if problem is not None:
            raise ValueError(f"input {i}: {problem}")


@dataclass(frozen=True)
class _Lexical:
    """The required and banned phrases of every source (None: none)."""

    required: Sequence[Phrases] | None
    banned: Sequence[Phrases] | None

    def of(self, idx: Sequence[int]) -> tuple[list[Phrases], list[Phrases]]:
        """The required and banned phrases of the sources ``idx``; empty lists when none has any."""
        required = [self.required[i] for i in idx] if self.required is not None else []
        banned = [self.banned[i] for i in idx] if self.banned is not None else []
        return (required if any(required) else [], banned if any(banned) else [])


def _generate(searcher: Searcher,
              sources: Sequence[list[int]], config: DecodeConfig, *,
              device: torch.device, constraints: ConstraintFactory | None,
              position_limit: int | None, positions: Sequence[int], prefixes: Sequence[list[int]] | None,
              given: int, lexical: _Lexical, progress: bool,
              cancelled: Cancelled | None) -> list[list[Hypothesis]]:
    results: list[list[Hypothesis]] = [[] for _ in sources]
    bar = Counter(total=len(sources), desc="decode", unit="sentences", progress=progress, logger=log)
    for batch in length_batches([len(s) for s in sources], config.batch_tokens):
        idx = batch if cancelled is None else [i for i in batch if not cancelled(i)]
        if not idx:
            bar.update(len(batch))
            continue
        # a row of this batch's ``src`` asks about the source it holds
        rows_cancelled = None if cancelled is None else lambda b, idx=idx: cancelled(idx[b])
        lengths = [max_output_length(len(sources[i]) - 1, config, limit=position_limit) for i in idx]
        forced = None
        if prefixes is not None and any(prefixes[i] for i in idx):
            lengths = [max(length, len(prefixes[i])) for length, i in zip(lengths, idx)]
            forced = [prefixes[i] for i in idx]
        wanted = _wanted(idx, forced, lexical)  # each sample decodes as a source of its own
        required, banned = lexical.of(idx)
        # required phrases are searched, and samples drawn, over the whole vocabulary: the
        # draw's float sums follow its columns, which a shortlist's batch would move
        model = searcher([w for w in wanted for _ in range(config.sample)] if config.sample else wanted,
                         bool(required) or bool(config.sample))
        if config.sample:
            results_of = _sample(model, sources, idx, lengths, config, device=device,
                                 constraints=constraints, positions=positions, forced=forced, given=given,
                                 banned=banned, cancelled=rows_cancelled)
            for i, hyps in zip(idx, results_of):
                results[i] = hyps
            bar.update(len(batch))
            continue
        src = pad_batch([sources[i] for i in idx]).to(device)
        constraint = constraints(idx) if constraints is not None and config.constrained else None
        with autocast(device, config.precision):
            out = _search(model, src, torch.tensor(lengths), config, constraint=constraint, forced=forced,
                          given=given, banned=banned, required=required, cancelled=rows_cancelled)
        for k, (i, hyps) in enumerate(zip(idx, out)):
            results[i] = hyps
            if not hyps and required and required[k] and not (rows_cancelled and rows_cancelled(k)):
                # the phrases fit, but the other rules left no way
                log.warning("input %d: no output contains its required phrases and keeps the other rules "
                            "(banned phrases, the task's constraint, the maximum length)", positions[i])
        bar.update(len(batch))
    bar.close()
    return results


def _search(model: SearchModel, src: Tensor, max_len: Tensor, config: DecodeConfig, *,
            constraint: Constraint | None, forced: list[list[int]] | None, given: int, banned: list[Phrases],
            required: list[Phrases], cancelled: Cancelled | None) -> list[list[Hypothesis]]:
    """The outputs of one batch of sources ``src`` [B, S]: greedy search where the settings
    ask for a beam of 1 and no phrase is required, beam search otherwise."""
    prefixes = None if forced is None else pad_batch(forced)  # [B, P]
    if config.beam == 1 and not required:
        return greedy_search(model, src, max_len=max_len, min_len=config.min_len, constraint=constraint,
                             no_repeat_ngram_size=config.no_repeat_ngram_size, prefixes=prefixes,
                             banned=banned, given=given, cancelled=cancelled)
    return beam_search(model, src, beam=config.beam, alpha=config.alpha, max_len=max_len,
                       min_len=config.min_len, nbest=config.nbest, constraint=constraint,
                       length_penalty=config.length_penalty, end_in_beam=config.end_in_beam,
                       no_repeat_ngram_size=config.no_repeat_ngram_size, prefixes=prefixes, banned=banned,
                       required=required, given=given, cancelled=cancelled)


def _wanted(idx: list[int], forced: list[list[int]] | None, lexical: _Lexical) -> list[list[int]]:
    """The target ids each source of a batch needs besides what a shortlist allows it:
    those of its forced prefix and of its required phrases."""
    required = lexical.of(idx)[0]
    return [[*(forced[k] if forced is not None else []),
             *(t for phrase in (required[k] if required else []) for t in phrase)] for k in range(len(idx))]


def _sample(model: SearchModel, sources: Sequence[list[int]], idx: list[int], lengths: list[int],
            config: DecodeConfig, *, device: torch.device, constraints: ConstraintFactory | None,
            positions: Sequence[int], forced: list[list[int]] | None, given: int,
            banned: list[Phrases], cancelled: Cancelled | None) -> list[list[Hypothesis]]:
    """``decode.sample`` samples of each of the sources ``idx`` (whose output lengths are
    ``lengths`` and target prefixes ``forced``): every sample decodes as a source of its
    own, with its input's stream."""
    n = config.sample
    rows = [i for i in idx for _ in range(n)]  # each source once per sample
    src = pad_batch([sources[i] for i in rows]).to(device)
    max_len = torch.tensor([length for length in lengths for _ in range(n)])
    uniforms = input_uniforms(config.seed, [positions[i] for i in idx], samples=n,
                              steps=[length + 1 for length in lengths])  # [B*n, L+1]
    constraint = constraints(rows) if constraints is not None and config.constrained else None
    prefixes = None if forced is None else pad_batch([p for p in forced for _ in range(n)])  # [B*n, P]
    truncation = Truncation(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                            epsilon=config.epsilon)
    with autocast(device, config.precision):
        out = sample_search(model, src, max_len=max_len, uniforms=uniforms, truncation=truncation,
                            min_len=config.min_len, constraint=constraint,
                            no_repeat_ngram_size=config.no_repeat_ngram_size,
                            prefixes=prefixes, banned=[p for p in banned for _ in range(n)], given=given,
                            cancelled=None if cancelled is None else lambda r: cancelled(r // n))
    return [[h for hyps in out[b * n : (b + 1) * n] for h in hyps] for b in range(len(idx))]
