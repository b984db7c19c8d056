"""What a client may send, declared once: a predict request (:data:`PREDICT`), a score
request (:data:`SCORE`) and a streaming session's message (:data:`STREAM_MESSAGE`). Each
declaration reads its bodies and gives the OpenAPI description its schema
(:mod:`seqtrans.serving.fields`); what only a model can check follows here: the inputs read
by the model's task, each within the token limits, and the decoding options checked by
the model's decoding settings."""

from __future__ import annotations

import dataclasses
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from seqtrans.config import DecodeConfig
from seqtrans.config.schema import DECODE_PRECISIONS
from seqtrans.data.batches import source_ids, target_ids, too_long
from seqtrans.errors import ConfigError, SeqtransError
from seqtrans.serving.errors import RequestError
from seqtrans.serving.fields import BOOLEAN, INTEGER, NUMBER, STRING, Bound, Field, Message, array
from seqtrans.serving.models import Served
from seqtrans.serving.settings import ServeSettings
from seqtrans.tasks.protocol import Codec, TargetParsing

log = logging.getLogger(__name__)

LENGTH_PENALTIES = typing.get_args(typing.get_type_hints(DecodeConfig)["length_penalty"])
#: The largest length-penalty alpha a request may ask for: far above any useful value
#: (0.6 to 2), and low enough that lp(Y) stays finite at any length the models reach.
MAX_ALPHA = 5.0
#: The decoding settings a predict request may change, for itself only.
DECODE_OPTIONS = ("beam", "nbest", "alpha", "length_penalty", "precision", "source_lang", "target_lang")


def _decode_option(name: str, kind: Any, also: str = "", **limits: Any) -> Field:
    """A predict option that sets ``decode.NAME`` for the request: its help is the setting's."""
    help = next(f.metadata["help"] for f in dataclasses.fields(DecodeConfig) if f.name == name)
    return Field(name, kind, f"decode.{name} for this request: {help}{also} Absent or null: the model's "
                 "own (GET /v1/models/NAME).", nullable=True, **limits)


PREDICT = Message("a predict request", shape="the body must be a JSON object with 'inputs'", fields=(
    Field("inputs", array(STRING, "a non-empty list of strings", min_items=1),
          "The inputs, each read by the model's task as `seqtrans predict` reads a line; at most the "
          "server's max_inputs, each of at most max_input_tokens source tokens.", required=True,
          bound=Bound("max_inputs", "too_many_inputs", "{value} inputs, more than the {limit} one request "
                      "may send")),
    _decode_option("beam", INTEGER, " At most the server's max_beam.", minimum=1,
                   bound=Bound("max_beam", "beam_too_large",
                               "beam {value} is larger than the server allows ({limit})")),
    _decode_option("nbest", INTEGER, " They come back as 'hypotheses', best first.", minimum=1),
    _decode_option("alpha", NUMBER, "", minimum=0, maximum=MAX_ALPHA),
    _decode_option("length_penalty", STRING, "", choices=LENGTH_PENALTIES),
    _decode_option("precision", STRING, " int8 only for a model served on a CPU, and only int8 for a "
                   "model loaded with decode.precision=int8.", choices=DECODE_PRECISIONS),
    Field("scores", BOOLEAN, "Each hypothesis with its scores.", nullable=True, default=False),
    Field("attention", BOOLEAN, "The best output's encoder-decoder attention, layers and heads averaged.",
          nullable=True, default=False),
    _decode_option("source_lang", STRING, " For a model of several (GET /v1/models/NAME lists them)."),
    _decode_option("target_lang", STRING, " For a model of several."),
))

SCORE = Message("a score request", shape='the body must be a JSON object {"pairs": [[source, target], ...]}',
                fields=(Field("pairs", array(array(STRING, "a [source, target] pair of strings", min_items=2,
                                                   max_items=2),
                                             "a non-empty list of [source, target] strings", min_items=1),
                              "The pairs to score, each read as the task reads a source and a target; at "
                              "most the server's max_inputs.", required=True,
                              bound=Bound("max_inputs", "too_many_inputs",
                                          "{value} pairs, more than the {limit} one request may send")),))

STREAM_MESSAGE = Message(
    "a message", shape='a message is {"words": "..."} or {"end": true}', code="invalid_message",
    at_least_one=True, fields=(
        Field("words", STRING, "Whole words of the current sentence (characters, for a task that streams "
              "characters); null: none.", nullable=True),
        Field("end", BOOLEAN, "Whether the sentence ends with this message.", default=False,
              code="invalid_request")))


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
    given = PREDICT.read(body, settings)
    if given.get("precision") == "int8" and served.loaded.device.type != "cpu":
        raise RequestError("invalid_request", "precision int8 is for models served on a CPU",
                           field="precision")
    loaded = served.loaded
    changes = {k: given[k] for k in DECODE_OPTIONS if k in given}
    try:
        decode = dataclasses.replace(loaded.config.decode, **changes)
    except ConfigError as exc:
        raise _option_refused(exc) from None
    if decode.precision != "int8" and loaded.config.decode.precision == "int8":
        raise RequestError("invalid_request", f"precision {decode.precision} needs float weights, and this "
                           "model is served in int8 only (loaded with decode.precision=int8)",
                           field="precision")
    try:
        codec = loaded.codec_for(decode)
    except ConfigError as exc:
        raise _option_refused(exc) from None
    sources, tokens = _read_inputs(served, given["inputs"], settings, codec)
    return Prediction(sources, tokens, decode, given["scores"], given["attention"], codec)


def _read_inputs(served: Served, inputs: list[str], settings: ServeSettings,
                 codec: Codec[Any, Any, Any]) -> tuple[list[Any], int]:
    """The task's sources of a request's inputs and their tokens, each within the limits."""
    sources, tokens = [], 0
    for i, text in enumerate(inputs):
        field = f"inputs[{i}]"
        source = _by_task(served, field, served.loaded.task.parse_source, text)
        length = len(_by_task(served, field, source_ids, codec, source))
        if length - 1 > settings.max_input_tokens:
            raise RequestError("input_too_long", f"input {i}: {length - 1} source tokens, more than the "
                               f"{settings.max_input_tokens} the server allows", limit="max_input_tokens",
                               field=field)
        for model in served.loaded.models:
            problem = too_long(model.config, codec, source)
            if problem is not None:
                raise RequestError("input_too_long", f"input {i}: {problem}", limit="model.max_positions",
                                   field=field)
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
    pairs = SCORE.read(body, settings)["pairs"]
    task = loaded.task
    if not isinstance(task, TargetParsing):
        raise RequestError("cannot_score", f"task '{loaded.config.task}' cannot read targets from text, so "
                           "its pairs cannot be scored")
    sources, targets, tokens = [], [], 0
    for i, (source_text, target_text) in enumerate(pairs):
        first, second = f"pairs[{i}][0]", f"pairs[{i}][1]"
        source = _by_task(served, first, task.parse_source, source_text)
        target = _by_task(served, second, task.parse_target, target_text)
        src = _by_task(served, first, source_ids, loaded.codec, source)
        tgt = _by_task(served, second, target_ids, loaded.codec, target)
        longest = max(len(src) - 1, len(tgt))
        if longest > settings.max_input_tokens:
            raise RequestError("input_too_long", f"pair {i}: {longest} tokens on one side, more than the "
                               f"{settings.max_input_tokens} the server allows", limit="max_input_tokens",
                               field=f"pairs[{i}]")
        for model in loaded.models:
            limit = model.config.position_limit
            if limit is not None and max(len(src), len(tgt) + 1) > limit:
                raise RequestError("input_too_long", f"pair {i}: more tokens than the {limit} positions the "
                                   "model learned", limit="model.max_positions", field=f"pairs[{i}]")
        sources.append(src)
        targets.append(tgt)
        tokens += len(src) + len(tgt) + 1
    return Scoring(sources, targets, tokens)


def _by_task(served: Served, field: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``: the task reading, or its codec encoding, the input ``field``;
    whatever it raises is the input's problem, a 422 naming the field."""
    try:
        return function(*args)
    except SeqtransError as exc:
        raise RequestError("invalid_input", f"{field}: {getattr(exc, 'problem', exc)}", field=field) from None
    except Exception as exc:
        raise _unreadable(served, field, exc) from None


def _unreadable(served: Served, field: str, exc: Exception) -> RequestError:
    """A task that fails on an input with an exception other than its documented
    :class:`SeqtransError` still could not read that input: the client's request is
    refused, and the log keeps the exception for the task's author."""
    log.warning("task %s failed on %s of a request to %s: %s: %s", served.loaded.config.task, field,
                served.name, type(exc).__name__, exc)
    return RequestError("invalid_input", f"{field}: the task cannot read this text ({type(exc).__name__})",
                        field=field)


def _option_refused(exc: ConfigError) -> RequestError:
    """A config error as the request's option names it."""
    option = exc.key.removeprefix("decode.")
    return RequestError("invalid_request", f"'{option}': {exc.problem}", field=option)
