"""Target phrases given as text (``decode.banned``, forced prefixes, constraint
phrases), read as the task reads a target and encoded with the model's target
vocabulary. Nothing here needs a loaded run: evaluation and a loaded run's decoding
read ``decode.banned`` through this module, and :mod:`.lexical` the phrases of a
constraints file."""

from __future__ import annotations

from typing import Any

from seqtrans.config import DecodeConfig
from seqtrans.data.vocab import UNK
from seqtrans.errors import ConfigError, DataError
from seqtrans.tasks.protocol import Codec, TargetParsing, Task


class Unreadable(Exception):
    """Why a target text cannot be encoded (the caller names where it came from)."""


def target_ids(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any], text: str) -> list[int]:
    """The target ids of ``text`` read as the task reads a target; :class:`Unreadable`
    if the task cannot read it or the target vocabulary lacks one of its tokens."""
    if not isinstance(task, TargetParsing):
        raise Unreadable("the task cannot read a target (it has no parse_target)")
    try:
        target = task.parse_target(text)
    except DataError as exc:
        raise Unreadable(exc.problem) from None
    tokens = codec.target_tokens(target)
    vocab = codec.vocabularies.target
    unknown = [t for t in tokens if vocab.index(t) == UNK]
    if unknown:
        shown = ", ".join(repr(t) for t in unknown[:10])
        raise Unreadable(f"{len(unknown)} token(s) not in the model's target vocabulary: {shown}")
    return vocab.encode(tokens)


def banned_ids(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any],
               decode: DecodeConfig) -> list[list[int]]:
    """The phrases of ``decode.banned`` as target ids; a :class:`ConfigError` naming the
    key for a phrase that cannot be read or encoded."""
    phrases = []
    for text in decode.banned:
        try:
            ids = target_ids(task, codec, text)
        except Unreadable as exc:
            raise ConfigError("decode.banned", f"phrase {text!r}: {exc}") from None
        if not ids:
            raise ConfigError("decode.banned", f"phrase {text!r} has no tokens")
        phrases.append(ids)
    return phrases
