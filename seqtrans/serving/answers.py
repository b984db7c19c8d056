"""What the server answers, declared once beside the functions that build it: a
prediction's outputs formatted by the task as ``seqtrans predict`` formats them, a pair's
scores, a model's description, an error, and a streaming session's messages. The OpenAPI
description serves these declarations as the answers' schemas (tested against real
answers)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from seqtrans.config import DecodeConfig
from seqtrans.data.batches import prediction
from seqtrans.decoding.search import Hypothesis, length_penalty
from seqtrans.inference.loading import Loaded
from seqtrans.inference.scoring import PairScore
from seqtrans.serving.fields import BOOLEAN, INTEGER, NUMBER, STRING, Field, Message, array, obj
from seqtrans.serving.requests import Prediction
from seqtrans.streaming.session import Update, Word

STRINGS = array(STRING, "a list of strings")
NUMBERS = array(NUMBER, "a list of numbers")
INTEGERS = array(INTEGER, "a list of integers")

HYPOTHESIS = Message("a hypothesis", (
    Field("output", STRING, "The hypothesis, formatted by the task.", required=True),
    Field("score", NUMBER, "What beam search ranks by (with scores)."),
    Field("log_prob", NUMBER, "log P(output | input), the end symbol included (with scores)."),
    Field("normalized_score", NUMBER, "log_prob divided by the length penalty (with scores)."),
    Field("tokens", STRINGS, "The output's target tokens (with scores).")))
ATTENTION = Message("an attention map", (
    Field("source", STRINGS, "The source tokens, the end symbol included.", required=True),
    Field("target", STRINGS, "The best output's tokens, the end symbol included.", required=True),
    Field("weights", array(NUMBERS, "a list of rows"), "A row per target token, one weight per source token.",
          required=True)))
OUTPUT = Message("an output", (
    Field("output", STRING, "The best output, formatted by the task.", required=True),
    Field("hypotheses", array(obj(HYPOTHESIS), "a list of hypotheses"),
          "With nbest above 1, sampling or scores: every hypothesis, best first."),
    Field("attention", obj(ATTENTION), "With attention: the best output's encoder-decoder attention.")))
PREDICTED = Message("a prediction", (
    Field("model", STRING, "The model's name.", required=True),
    Field("outputs", array(obj(OUTPUT), "a list of outputs"), "One per input, in order.", required=True)))
PAIR_SCORE = Message("a score", (
    Field("log_prob", NUMBER, "log P(target | source), the end symbol included.", required=True),
    Field("per_token", NUMBER, "log_prob per target token.", required=True),
    Field("tokens", INTEGER, "The target's tokens, the end symbol included.", required=True),
    Field("normalized_score", NUMBER, "log_prob divided by the model's length penalty.", required=True)))
SCORES = Message("scores", (
    Field("model", STRING, "The model's name.", required=True),
    Field("scores", array(obj(PAIR_SCORE), "a list of scores"), "One per pair, in order.", required=True)))


def outputs(loaded: Loaded, request: Prediction, hyps: Sequence[list[Hypothesis]],
            attention: Sequence[Tensor | None] | None = None) -> list[dict[str, Any]]:
    """One JSON object per input (:data:`OUTPUT`) of a ``loaded`` model's hypotheses:
    ``output`` (the best, formatted by the task); with n-best or scores asked for,
    ``hypotheses``, best first; with ``attention`` (a [T, S] map per input, of its best
    output), the map with its tokens."""
    codec = request.codec
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


def score(pair: PairScore, *, alpha: float, kind: str) -> dict[str, Any]:
    """A pair's :data:`PAIR_SCORE`, normalised by the length penalty ``kind`` at ``alpha``."""
    return {"log_prob": pair.log_prob, "per_token": pair.per_token, "tokens": pair.tokens,
            "normalized_score": pair.normalized(alpha, kind=kind)}




def _setting(setting: dataclasses.Field[Any]) -> Field:
    """A decoding setting as a model's description holds it, with its help."""
    hint = typing.get_type_hints(DecodeConfig)[setting.name]
    choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
    kind = STRING if choices else {int: INTEGER, float: NUMBER, bool: BOOLEAN, str: STRING,
                                   tuple[str, ...]: STRINGS}[hint]
    return Field(setting.name, kind, setting.metadata["help"], required=True, choices=choices)


DESCRIBED = Message("a model", (
    Field("name", STRING, "The name it is served by.", required=True),
    Field("task", STRING, "Its task plugin.", required=True),
    Field("decode", obj(Message("decoding settings", tuple(map(_setting, dataclasses.fields(DecodeConfig))))),
          "Its decoding settings: the run's decode.*, each with its help.", required=True),
    Field("attention", obj(Message("attention kinds", tuple(
        Field(site, STRING, f"The {site} attention's mechanism.", required=True)
        for site in ("encoder", "decoder", "cross")))), "Its attention mechanisms.", required=True),
    Field("ensemble", INTEGER, "How many models are searched together (1: one).", required=True),
    Field("streaming", BOOLEAN, "Whether it decodes a stream (/v1/models/NAME/stream).", required=True),
    Field("languages", STRINGS, "The language codes of a model of several (empty otherwise).",
          required=True)))
MODELS = Message("the models", (
    Field("models", array(obj(DESCRIBED), "a list of models"), "Each served model.", required=True),))
PROBLEM = Message("a problem", (
    Field("code", STRING, "What went wrong (seqtrans.serving.errors.CODES).", required=True),
    Field("message", STRING, "What went wrong, in words.", required=True),
    Field("field", STRING, "Where in the body the problem is, such as inputs[0] or alpha."),
    Field("limit", STRING, "The setting whose limit was passed.")))
ERROR = Message("an error", (Field("error", obj(PROBLEM), "The refusal.", required=True),))
STATUS = Message("a status", (
    Field("status", STRING, "alive, ready or warming.", required=True),
    Field("models", STRINGS, "The models served, once ready.")))

TOKEN = Message("a token", (
    Field("token", STRING, "A target token, as soon as it is decided.", required=True),
    Field("delay", INTEGER, "The source tokens read when it was decided.", required=True),
    Field("word_delay", INTEGER, "The source words read when it was decided.", required=True)))
WORD = Message("a word", (
    Field("word", STRING, "An output word, once complete.", required=True),
    Field("delay", INTEGER, "The source words read by then.", required=True)))
DONE = Message("a sentence's end", (
    Field("done", BOOLEAN, "Always true.", required=True),
    Field("output", STRING, "The sentence's output, formatted by the task.", required=True),
    Field("delays", INTEGERS, "Its words' delays.", required=True),
    Field("token_delays", INTEGERS, "Its tokens' delays.", required=True)))


def streamed(update: Update) -> list[dict[str, Any]]:
    """The :data:`TOKEN` and :data:`WORD` messages of a streaming step."""
    return ([{"token": t.text, "delay": t.delay, "word_delay": t.word_delay} for t in update.tokens]
            + [word(w) for w in update.words])


def word(out: Word) -> dict[str, Any]:
    return {"word": out.text, "delay": out.delay}


def done(output: str, delays: list[int], token_delays: list[int]) -> dict[str, Any]:
    """A sentence's :data:`DONE` message."""
    return {"done": True, "output": output, "delays": delays, "token_delays": token_delays}
