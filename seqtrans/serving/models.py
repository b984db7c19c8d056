"""The models a server offers, by name, and what a predict request asks of one: its
inputs read by the model's task, its decoding options checked, its outputs formatted by
the task as ``seqtrans predict`` formats them."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from seqtrans import config as cfg
from seqtrans.config import DecodeConfig
from seqtrans.data import prediction, source_ids, target_ids, too_long
from seqtrans.decoding.search import Hypothesis, length_penalty
from seqtrans.errors import ConfigError, SeqtransError, UsageError
from seqtrans.inference.loading import Loaded
from seqtrans.serving.settings import ServeSettings
from seqtrans.tasks.protocol import TargetParsing


class RequestError(Exception):
    """A request the server refuses: the HTTP status and a JSON-ready error naming what
    was wrong (and the limit, where one was passed)."""

    def __init__(self, status: int, code: str, message: str, *, limit: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.limit = limit
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.limit is not None:
            error["limit"] = self.limit
        return {"error": error}


@dataclass(frozen=True)
class Served:
    """A loaded run offered under ``name``."""

    name: str
    loaded: Loaded

    @property
    def streams(self) -> bool:
        """Whether the model can decode word by word as the source arrives."""
        from seqtrans.inference.session import check_streaming

        config = self.loaded.config
        greedy = dataclasses.replace(config, decode=dataclasses.replace(config.decode, nbest=1, sample=0))
        try:
            check_streaming(dataclasses.replace(self.loaded, config=greedy))
        except SeqtransError:
            return False
        return True

    def describe(self) -> dict[str, Any]:
        model = self.loaded.config.model
        return {"name": self.name, "task": self.loaded.config.task,
                "decode": cfg.to_dict(self.loaded.config.decode),
                "attention": {"encoder": model.encoder_attention, "decoder": model.decoder_attention,
                              "cross": model.cross_attention},
                "ensemble": len(self.loaded.models), "streaming": self.streams}


def model_names(paths: Sequence[str]) -> dict[str, str]:
    """Names for the runs given on the command line: ``NAME=RUN_DIR`` names one, else
    its directory's name (a checkpoint's run directory); ``NAME=RUN_A,RUN_B`` names an
    ensemble, which needs its name. Two runs of one name are refused."""
    names: dict[str, str] = {}
    for given in paths:
        name, sep, path = given.partition("=")
        if not sep:
            if "," in given:
                raise UsageError(f"{given}: an ensemble needs a name: NAME={given}")
            path = given
            where = Path(given).resolve()
            if where.is_file():
                where = where.parent.parent if where.parent.name == "checkpoints" else where.parent
            name = where.name
        if not name or "/" in name:
            raise UsageError(f"{given}: a model name must be non-empty and have no '/'")
        if name in names:
            raise UsageError(f"two models named '{name}' ({names[name]} and {path}): name them "
                             "with NAME=RUN_DIR")
        names[name] = path
    return names


def load_served(name: str, path: str, *, device: str) -> Served:
    """The run (or the ensemble of the comma-separated runs) ``path``, offered as ``name``."""
    from seqtrans.inference.loading import load_ensemble

    return Served(name, load_ensemble(path.split(","), device=device))


LENGTH_PENALTIES = typing.get_args(typing.get_type_hints(DecodeConfig)["length_penalty"])
#: Per-request options of predict: the JSON types each takes.
OPTIONS: dict[str, tuple[type, ...]] = {"beam": (int,), "nbest": (int,), "alpha": (int, float),
                                        "length_penalty": (str,), "precision": (str,), "scores": (bool,),
                                        "attention": (bool,)}


@dataclass(frozen=True)
class Prediction:
    """A checked predict request: the sources as the task reads them, their token counts
    and the decoding settings."""

    sources: list[Any]
    tokens: int  # source tokens, end symbols included: what the batcher counts
    decode: DecodeConfig
    scores: bool
    attention: bool  # the encoder-decoder attention of each best output


def parse_predict(served: Served, body: Any, settings: ServeSettings) -> Prediction:
    """Check a predict request body (parsed JSON); a :class:`RequestError` says what is
    wrong with it."""
    if not isinstance(body, dict):
        raise RequestError(422, "invalid_request", "the body must be a JSON object with 'inputs'")
    unknown = sorted(set(body) - {"inputs", *OPTIONS})
    if unknown:
        raise RequestError(422, "invalid_request", f"unknown field(s) {', '.join(map(repr, unknown))}; a "
                           f"predict request takes inputs and the options {', '.join(OPTIONS)}")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, str) for x in inputs):
        raise RequestError(422, "invalid_request", "'inputs' must be a non-empty list of strings")
    if len(inputs) > settings.max_inputs:
        raise RequestError(413, "too_many_inputs", f"{len(inputs)} inputs, more than the "
                           f"{settings.max_inputs} one request may send", limit="max_inputs")
    for key, kinds in OPTIONS.items():
        value = body.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) != (bool in kinds)):
            raise RequestError(422, "invalid_request", f"'{key}' must be {_kind_name(kinds)}, got {value!r}")
    if body.get("beam") is not None and body["beam"] > settings.max_beam:
        raise RequestError(422, "beam_too_large", f"beam {body['beam']} is larger than the server allows "
                           f"({settings.max_beam})", limit="max_beam")
    if body.get("precision") == "int8" and served.loaded.device.type != "cpu":
        raise RequestError(422, "invalid_request", "precision int8 is for models served on a CPU")
    if body.get("precision") not in (None, "int8") and served.loaded.config.decode.precision == "int8":
        raise RequestError(422, "invalid_request", f"precision {body['precision']} needs float weights, "
                           "and this model is served in int8 only (loaded with decode.precision=int8)")
    decode = served.loaded.config.decode
    changes = {k: body[k] for k in ("beam", "nbest", "alpha", "length_penalty", "precision")
               if body.get(k) is not None}
    if changes.get("length_penalty", "gnmt") not in LENGTH_PENALTIES:
        raise RequestError(422, "invalid_request", f"'length_penalty' must be one of "
                           f"{', '.join(LENGTH_PENALTIES)}, got {changes['length_penalty']!r}")
    try:
        decode = dataclasses.replace(decode, **changes)
    except ConfigError as exc:
        raise RequestError(422, "invalid_request", _option_problem(exc)) from None
    sources, tokens = [], 0
    for i, text in enumerate(inputs):
        source = _read(served, text, i)
        length = len(source_ids(served.loaded.codec, source))
        if length - 1 > settings.max_input_tokens:
            raise RequestError(422, "input_too_long", f"input {i}: {length - 1} source tokens, more than the "
                               f"{settings.max_input_tokens} the server allows", limit="max_input_tokens")
        for model in served.loaded.models:
            problem = too_long(model.config, served.loaded.codec, source)
            if problem is not None:
                raise RequestError(422, "input_too_long", f"input {i}: {problem}",
                                   limit="model.max_positions")
        sources.append(source)
        tokens += length
    return Prediction(sources, tokens, decode, bool(body.get("scores")), bool(body.get("attention")))


@dataclass(frozen=True)
class Scoring:
    """A checked score request: the pairs as ids (sources ending in the end symbol,
    targets without it)."""

    sources: list[list[int]]
    targets: list[list[int]]
    tokens: int


def parse_score(served: Served, body: Any, settings: ServeSettings) -> Scoring:
    """Check a score request body ``{"pairs": [[source, target], ...]}``; a
    :class:`RequestError` says what is wrong with it."""
    loaded = served.loaded
    if not isinstance(body, dict) or set(body) != {"pairs"}:
        raise RequestError(422, "invalid_request",
                           'the body must be a JSON object {"pairs": [[source, target], ...]}')
    pairs = body["pairs"]
    if not isinstance(pairs, list) or not pairs or not all(_is_pair(p) for p in pairs):
        raise RequestError(422, "invalid_request",
                           "'pairs' must be a non-empty list of [source, target] strings")
    if len(pairs) > settings.max_inputs:
        raise RequestError(413, "too_many_inputs", f"{len(pairs)} pairs, more than the {settings.max_inputs} "
                           "one request may send", limit="max_inputs")
    task = loaded.task
    if not isinstance(task, TargetParsing):
        raise RequestError(422, "cannot_score", f"task '{loaded.config.task}' cannot read targets from text, "
                           "so its pairs cannot be scored")
    sources, targets, tokens = [], [], 0
    for i, (source_text, target_text) in enumerate(pairs):
        source = _read(served, source_text, i)
        try:
            target = task.parse_target(target_text)
        except SeqtransError as exc:
            raise RequestError(422, "invalid_input", f"target {i}: {getattr(exc, 'problem', exc)}") from None
        src, tgt = source_ids(loaded.codec, source), target_ids(loaded.codec, target)
        longest = max(len(src) - 1, len(tgt))
        if longest > settings.max_input_tokens:
            raise RequestError(422, "input_too_long", f"pair {i}: {longest} tokens on one side, more than "
                               f"the {settings.max_input_tokens} the server allows", limit="max_input_tokens")
        for model in loaded.models:
            limit = model.config.position_limit
            if limit is not None and max(len(src), len(tgt) + 1) > limit:
                raise RequestError(422, "input_too_long", f"pair {i}: more tokens than the {limit} positions "
                                   "the model learned", limit="model.max_positions")
        sources.append(src)
        targets.append(tgt)
        tokens += len(src) + len(tgt) + 1
    return Scoring(sources, targets, tokens)


def _is_pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)


def _read(served: Served, text: str, index: int) -> Any:
    try:
        return served.loaded.task.parse_source(text)
    except SeqtransError as exc:
        raise RequestError(422, "invalid_input", f"input {index}: {getattr(exc, 'problem', exc)}") from None


def _option_problem(exc: ConfigError) -> str:
    """A config error as the request's option names it."""
    return f"'{exc.key.removeprefix('decode.')}': {exc.problem}"


def _kind_name(kinds: tuple[type, ...]) -> str:
    names: dict[tuple[type, ...], str] = {(int,): "an integer", (int, float): "a number", (str,): "a string",
                                          (bool,): "true or false"}
    return names[kinds]


def outputs(served: Served, request: Prediction, hyps: Sequence[list[Hypothesis]],
            attention: Sequence[Tensor | None] | None = None) -> list[dict[str, Any]]:
    """One JSON object per input: ``output`` (the best, formatted by the task); with
    n-best or scores asked for, ``hypotheses``, best first; with ``attention`` (a [T, S]
    map per input, of its best output), the map with its tokens."""
    loaded = served.loaded
    several = request.decode.outputs_per_input > 1
    out = []
    for k, (source, nbest) in enumerate(zip(request.sources, hyps)):
        texts = [loaded.task.format(prediction(loaded.codec, h.tokens, source)) for h in nbest]
        record: dict[str, Any] = {"output": texts[0] if texts else
                                  loaded.task.format(prediction(loaded.codec, [], source))}
        if several or request.scores:
            hypotheses = []
            for hyp, text in zip(nbest, texts):
                entry: dict[str, Any] = {"output": text}
                if request.scores:
                    lp = float(length_penalty(float(len(hyp.tokens) + 1), request.decode.alpha,
                                              kind=request.decode.length_penalty))
                    entry.update(score=hyp.score, log_prob=hyp.log_prob, normalized_score=hyp.log_prob / lp,
                                 tokens=loaded.codec.vocabularies.target.decode(hyp.tokens))
                hypotheses.append(entry)
            record["hypotheses"] = hypotheses
        weights = attention[k] if attention is not None else None
        if weights is not None:
            best = nbest[0].tokens if nbest else []
            record["attention"] = {
                "source": [*loaded.codec.source_tokens(source), "</s>"],
                "target": [*loaded.codec.vocabularies.target.decode(best), "</s>"],
                "weights": [[round(w, 4) for w in row] for row in weights.tolist()]}  # [T, S]
        out.append(record)
    return out
