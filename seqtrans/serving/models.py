"""The models a server offers, by name, and what a predict request asks of one: its
inputs read by the model's task, its decoding options checked, its outputs formatted by
the task as ``seqtrans predict`` formats them."""

from __future__ import annotations

import dataclasses
import logging
import reprlib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from seqtrans import config as cfg
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import prediction, source_ids, target_ids, too_long
from seqtrans.decoding.search import Hypothesis, length_penalty
from seqtrans.errors import ConfigError, SeqtransError, UsageError
from seqtrans.inference.loading import Loaded
from seqtrans.serving.settings import ServeSettings
from seqtrans.tasks.protocol import Codec, Multilingual, TargetParsing

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the server refuses: the HTTP status and a JSON-ready error naming what
    was wrong (the ``field`` of the body, such as ``inputs[0]`` or ``alpha``, where one
    was; and the limit, where one was passed)."""

    def __init__(self, status: int, code: str, message: str, *, limit: str | None = None,
                 field: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.limit = limit
        self.field = None if field is None else clip(field)  # a field may be named by a client's key
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
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
        from seqtrans.streaming.session import check_streaming

        config = self.loaded.config
        greedy = dataclasses.replace(config, decode=dataclasses.replace(config.decode, nbest=1, sample=0))
        try:
            check_streaming(dataclasses.replace(self.loaded, config=greedy))
        except SeqtransError:
            return False
        return True

    def describe(self) -> dict[str, Any]:
        model, codec = self.loaded.config.model, self.loaded.codec
        return {"name": self.name, "task": self.loaded.config.task,
                "decode": cfg.to_dict(self.loaded.config.decode),
                "attention": {"encoder": model.encoder_attention, "decoder": model.decoder_attention,
                              "cross": model.cross_attention},
                "ensemble": len(self.loaded.models), "streaming": self.streams,
                "languages": list(codec.languages) if isinstance(codec, Multilingual) else []}


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
                                        "attention": (bool,), "source_lang": (str,), "target_lang": (str,)}
#: The largest length-penalty alpha a request may ask for: far above any useful value
#: (0.6 to 2), and low enough that lp(Y) stays finite at any length the models reach.
MAX_ALPHA = 5.0


@dataclass(frozen=True)
class Prediction:
    """A checked predict request: the sources as the task reads them, their token counts
    and the decoding settings."""

    sources: list[Any]
    tokens: int  # source tokens, end symbols included: what the batcher counts
    decode: DecodeConfig
    scores: bool
    attention: bool  # the encoder-decoder attention of each best output
    codec: Codec[Any, Any, Any]  # the model's, bound to the request's languages


def parse_predict(served: Served, body: Any, settings: ServeSettings) -> Prediction:
    """Check a predict request body (parsed JSON); a :class:`RequestError` says what is
    wrong with it."""
    if not isinstance(body, dict):
        raise RequestError(422, "invalid_request", "the body must be a JSON object with 'inputs'")
    unknown = sorted(set(body) - {"inputs", *OPTIONS})
    if unknown:
        names = ", ".join(_short(u) for u in unknown)
        raise RequestError(422, "invalid_request", f"unknown field(s) {names}; a predict request takes "
                           f"inputs and the options {', '.join(OPTIONS)}", field=unknown[0])
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(422, "invalid_request", "'inputs' must be a non-empty list of strings",
                           field="inputs")
    for i, x in enumerate(inputs):
        if not isinstance(x, str):
            raise RequestError(422, "invalid_request", f"inputs[{i}]: must be a string, got {_short(x)}",
                               field=f"inputs[{i}]")
    if len(inputs) > settings.max_inputs:
        raise RequestError(413, "too_many_inputs", f"{len(inputs)} inputs, more than the "
                           f"{settings.max_inputs} one request may send", limit="max_inputs", field="inputs")
    for key, kinds in OPTIONS.items():
        value = body.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) != (bool in kinds)):
            raise RequestError(422, "invalid_request", f"'{key}' must be {_kind_name(kinds)}, got "
                               f"{_short(value)}", field=key)
    if body.get("beam") is not None and body["beam"] > settings.max_beam:
        raise RequestError(422, "beam_too_large", f"beam {body['beam']} is larger than the server allows "
                           f"({settings.max_beam})", limit="max_beam", field="beam")
    alpha = body.get("alpha")
    if alpha is not None and not 0 <= alpha <= MAX_ALPHA:  # also refuses NaN
        raise RequestError(422, "invalid_request", f"'alpha' must be a number from 0 to {MAX_ALPHA:g}, got "
                           f"{_short(alpha)}", field="alpha")
    if body.get("precision") == "int8" and served.loaded.device.type != "cpu":
        raise RequestError(422, "invalid_request", "precision int8 is for models served on a CPU",
                           field="precision")
    decode = served.loaded.config.decode
    changes = {k: body[k] for k in ("beam", "nbest", "alpha", "length_penalty", "precision", "source_lang",
                                    "target_lang") if body.get(k) is not None}
    if changes.get("length_penalty", "gnmt") not in LENGTH_PENALTIES:
        raise RequestError(422, "invalid_request", f"'length_penalty' must be one of "
                           f"{', '.join(LENGTH_PENALTIES)}, got {_short(changes['length_penalty'])}",
                           field="length_penalty")
    try:
        decode = dataclasses.replace(decode, **changes)
    except ConfigError as exc:
        raise RequestError(422, "invalid_request", _option_problem(exc),
                           field=exc.key.removeprefix("decode.")) from None
    if decode.precision != "int8" and served.loaded.config.decode.precision == "int8":
        raise RequestError(422, "invalid_request", f"precision {decode.precision} needs float weights, "
                           "and this model is served in int8 only (loaded with decode.precision=int8)",
                           field="precision")
    try:
        codec = served.loaded.codec_for(decode)
    except ConfigError as exc:
        raise RequestError(422, "invalid_request", _option_problem(exc),
                           field=exc.key.removeprefix("decode.")) from None
    sources, tokens = _read_inputs(served, inputs, settings, codec)
    return Prediction(sources, tokens, decode, bool(body.get("scores")), bool(body.get("attention")), codec)


def _read_inputs(served: Served, inputs: list[str], settings: ServeSettings,
                 codec: Codec[Any, Any, Any]) -> tuple[list[Any], int]:
    """The task's sources of a request's inputs and their tokens, each within the limits."""
    sources, tokens = [], 0
    for i, text in enumerate(inputs):
        field = f"inputs[{i}]"
        source = _by_task(served, field, served.loaded.task.parse_source, text)
        length = len(_by_task(served, field, source_ids, codec, source))
        if length - 1 > settings.max_input_tokens:
            raise RequestError(422, "input_too_long", f"input {i}: {length - 1} source tokens, more than the "
                               f"{settings.max_input_tokens} the server allows", limit="max_input_tokens",
                               field=field)
        for model in served.loaded.models:
            problem = too_long(model.config, codec, source)
            if problem is not None:
                raise RequestError(422, "input_too_long", f"input {i}: {problem}",
                                   limit="model.max_positions", field=field)
        sources.append(source)
        tokens += length
    return sources, tokens


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
        unknown = sorted(set(body) - {"pairs"}) if isinstance(body, dict) else []
        raise RequestError(422, "invalid_request",
                           'the body must be a JSON object {"pairs": [[source, target], ...]}',
                           field=unknown[0] if unknown else None)
    pairs = body["pairs"]
    if not isinstance(pairs, list) or not pairs:
        raise RequestError(422, "invalid_request", "'pairs' must be a non-empty list of [source, target] "
                           "strings", field="pairs")
    for i, pair in enumerate(pairs):
        if not _is_pair(pair):
            raise RequestError(422, "invalid_request", f"pairs[{i}]: must be a [source, target] pair of "
                               f"strings, got {_short(pair)}", field=f"pairs[{i}]")
    if len(pairs) > settings.max_inputs:
        raise RequestError(413, "too_many_inputs", f"{len(pairs)} pairs, more than the {settings.max_inputs} "
                           "one request may send", limit="max_inputs", field="pairs")
    task = loaded.task
    if not isinstance(task, TargetParsing):
        raise RequestError(422, "cannot_score", f"task '{loaded.config.task}' cannot read targets from text, "
                           "so its pairs cannot be scored")
    sources, targets, tokens = [], [], 0
    for i, (source_text, target_text) in enumerate(pairs):
        first, second = f"pairs[{i}][0]", f"pairs[{i}][1]"
        source = _by_task(served, first, task.parse_source, source_text)
        target = _by_task(served, second, task.parse_target, target_text)
        src = _by_task(served, first, source_ids, loaded.codec, source)
        tgt = _by_task(served, second, target_ids, loaded.codec, target)
        longest = max(len(src) - 1, len(tgt))
        if longest > settings.max_input_tokens:
            raise RequestError(422, "input_too_long", f"pair {i}: {longest} tokens on one side, more than "
                               f"the {settings.max_input_tokens} the server allows", limit="max_input_tokens",
                               field=f"pairs[{i}]")
        for model in loaded.models:
            limit = model.config.position_limit
            if limit is not None and max(len(src), len(tgt) + 1) > limit:
                raise RequestError(422, "input_too_long", f"pair {i}: more tokens than the {limit} positions "
                                   "the model learned", limit="model.max_positions", field=f"pairs[{i}]")
        sources.append(src)
        targets.append(tgt)
        tokens += len(src) + len(tgt) + 1
    return Scoring(sources, targets, tokens)


def _is_pair(item: Any) -> bool:
    return isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)


def _by_task(served: Served, field: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``: the task reading, or its codec encoding, the input ``field``;
    whatever it raises is the input's problem, a 422 naming the field."""
    try:
        return function(*args)
    except SeqtransError as exc:
        raise RequestError(422, "invalid_input", f"{field}: {getattr(exc, 'problem', exc)}",
                           field=field) from None
    except Exception as exc:
        raise _unreadable(served, field, exc) from None


def _unreadable(served: Served, field: str, exc: Exception) -> RequestError:
    """A task that fails on an input with an exception other than its documented
    :class:`SeqtransError` still could not read that input: the client's request is
    refused, and the log keeps the exception for the task's author."""
    log.warning("task %s failed on %s of a request to %s: %s: %s", served.loaded.config.task, field,
                served.name, type(exc).__name__, exc)
    return RequestError(422, "invalid_input", f"{field}: the task cannot read this text "
                        f"({type(exc).__name__})", field=field)


#: How much of a name a client sent (a model's, a field's) an error echoes.
ECHOED = 100


def clip(text: str) -> str:
    """``text``, cut to ``ECHOED`` characters: an error does not echo a 100 KB name back."""
    return text if len(text) <= ECHOED else text[:ECHOED] + "..."


def _short(value: Any) -> str:
    """``repr(value)``, shortened: messages do not echo large bodies."""
    return reprlib.repr(value)


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
    loaded, codec = served.loaded, request.codec
    several = request.decode.outputs_per_input > 1
    out = []
    for k, (source, nbest) in enumerate(zip(request.sources, hyps)):
        texts = [loaded.task.format(prediction(codec, h.tokens, source)) for h in nbest]
        record: dict[str, Any] = {"output": texts[0] if texts else
                                  loaded.task.format(prediction(codec, [], source))}
        if several or request.scores:
            hypotheses = []
            for hyp, text in zip(nbest, texts):
                entry: dict[str, Any] = {"output": text}
                if request.scores:
                    lp = float(length_penalty(float(len(hyp.tokens) + 1), request.decode.alpha,
                                              kind=request.decode.length_penalty))
                    entry.update(score=hyp.score, log_prob=hyp.log_prob, normalized_score=hyp.log_prob / lp,
                                 tokens=codec.vocabularies.target.decode(hyp.tokens))
                hypotheses.append(entry)
            record["hypotheses"] = hypotheses
        weights = attention[k] if attention is not None else None
        if weights is not None:
            best = nbest[0].tokens if nbest else []
            record["attention"] = {
                "source": [*codec.source_tokens(source), "</s>"],
                "target": [*codec.vocabularies.target.decode(best), "</s>"],
                "weights": [[round(w, 4) for w in row] for row in weights.tolist()]}  # [T, S]
        out.append(record)
    return out
