"""What a caller hands a loaded model, checked before anything is decoded: lines of text
(``texts``, read as ``seqtrans predict`` reads its input lines) or parsed sources
(``sources``, the task's objects, as ``task.parse_source`` returns them).

The two cannot be told apart by decoding them: a copy model decodes the text
``"3 1 4"`` as the characters ``3``, `` ``, ``1`` ... and answers something. So the one
given where the other is wanted is a :class:`~seqtrans.errors.UsageError` naming the
argument and saying what to pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seqtrans.errors import UsageError
from seqtrans.tasks.protocol import Codec, Task


def check_texts(texts: Any, *, argument: str, instead: str) -> list[str]:
    """``texts`` as a list, each a line of text; ``instead`` says where a caller with
    parsed objects should go."""
    _check_list(texts, argument=argument, what="lines of text (str)")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise UsageError(f"{argument}[{i}]: expected a line of text (str), got {_kind(text)}; "
                             f"{instead}")
    return list(texts)


def check_text(text: Any, *, argument: str) -> str:
    """``text``, one line of text."""
    if not isinstance(text, str):
        raise UsageError(f"{argument}: expected a line of text (str), got {_kind(text)}")
    return text


def check_sources(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any], sources: Any, *,
                  argument: str = "sources") -> list[Any]:
    """``sources`` as a list, each a parsed source of ``task``. A str is one only where the
    task reads a line into that same str (translation's sources are their text); a source
    the codec cannot tokenize is refused with the codec's complaint."""
    _check_list(sources, argument=argument, what="parsed sources (what loaded.task.parse_source returns)")
    for i, source in enumerate(sources):
        if isinstance(source, str):
            if not isinstance(task.parse_source(source), str):
                raise UsageError(f"{argument}[{i}]: got the text {_shown(source)}, but this task's sources "
                                 "are parsed objects: pass loaded.parse(texts) (loaded.task.parse_source "
                                 "of each line), or give text to loaded.predict(texts)")
            continue
        if source is None or isinstance(source, (bool, int, float, bytes)):
            raise UsageError(f"{argument}[{i}]: got {_kind(source)}, not a source: pass "
                             "loaded.parse(texts) for lines of text")
        try:
            tokens = codec.source_tokens(source)
        except (TypeError, AttributeError, ValueError) as exc:
            raise UsageError(f"{argument}[{i}]: {_kind(source)} is not a source of this task ({exc}): pass "
                             "loaded.parse(texts) for lines of text") from exc
        if not all(isinstance(t, str) for t in tokens):
            raise UsageError(f"{argument}[{i}]: {_kind(source)} is not a source of this task (its tokens are "
                             "not strings): pass loaded.parse(texts) for lines of text")
    return list(sources)


def _check_list(value: Any, *, argument: str, what: str) -> None:
    # a bare str is a Sequence too, of characters: the silent wrong answer this module is for
    if isinstance(value, (str, bytes)):
        raise UsageError(f"{argument}: expected a list of {what}, got {_kind(value)}; wrap one in a list")
    if not isinstance(value, Sequence):
        raise UsageError(f"{argument}: expected a list of {what}, got {_kind(value)}")


def _kind(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"the str {_shown(value)}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({_shown(value)})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
