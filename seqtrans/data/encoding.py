"""Task objects to ids and back through a task's codec, and the length filter of
training pairs.

No torch here: encoding runs in worker processes (:mod:`seqtrans.prepare`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any

from seqtrans.data.vocab import EOS
from seqtrans.tasks.protocol import Codec, TargetPrefixing


def source_ids(codec: Codec[Any, Any, Any], source: Any) -> list[int]:
    """A source's ids through the task's codec, ending with EOS."""
    return codec.vocabularies.source.encode(codec.source_tokens(source)) + [EOS]


def forced_prefix(codec: Codec[Any, Any, Any]) -> list[int]:
    """The target ids every output of the codec starts with (a target language's code,
    :class:`~seqtrans.tasks.protocol.TargetPrefixing`); empty for most codecs."""
    if isinstance(codec, TargetPrefixing) and codec.target_prefix():
        return codec.vocabularies.target.encode(codec.target_prefix())
    return []


def target_ids(codec: Codec[Any, Any, Any], target: Any) -> list[int]:
    """A reference's ids through the task's codec, without BOS or EOS."""
    return codec.vocabularies.target.encode(codec.target_tokens(target))


def prediction(codec: Codec[Any, Any, Any], ids: Iterable[int], source: Any) -> Any:
    """The task's prediction from decoded target ids (up to the first EOS)."""
    return codec.prediction(codec.vocabularies.target.decode(ids), source)


def within(max_length: int, source: Sized, target: Sized) -> bool:
    """Whether a pair is kept for training under ``train.max_length``: its source ids
    (with their end symbol) and its target ids with the end symbol each at most
    ``max_length`` long."""
    return len(source) <= max_length and len(target) + 1 <= max_length
